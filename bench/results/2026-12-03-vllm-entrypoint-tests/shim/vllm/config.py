import json

from vllm._tok import FOLDER


class ModelConfig:
    """Only get_vocab_size, of the model minipaged serves."""

    def __init__(self, *args, **kwargs):
        self.hf_config = json.loads((FOLDER / "config.json").read_text())

    def get_vocab_size(self):
        return self.hf_config["vocab_size"]
