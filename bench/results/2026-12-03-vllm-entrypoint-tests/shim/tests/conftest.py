import pytest


class LocalAssetServer:  # only the multimodal cases use it; they are N/A here
    def url_for(self, name):
        return f"http://127.0.0.1:1/{name}"


@pytest.fixture(scope="session")
def local_asset_server():
    return LocalAssetServer()
