"""The worker's side of the routers' protocol (workers.py) and clients told apart behind
a proxy (clients.TrustedProxies), on servers started in this process on 127.0.0.1:
the shapes each router reads, the reset's effect on the prefix cache (parked blocks
dropped, a running sequence's kept), metric families present on a cold replica, and
who a request counts as when it comes through a router.
"""

import asyncio
import json
import random
import threading

import httpx
import pytest
from checkpoints import write_checkpoint
from prometheus_client.parser import text_string_to_metric_families
from test_serve import VOCAB, metric, serve, wait_until_idle

from minipaged import LLM
from minipaged.tools.serve.api import Server, ServerConfig
from minipaged.tools.serve.cli import ServerThread, build_parser
from minipaged.tools.serve.clients import TrustedProxies
from minipaged.tools.serve.loop import EngineLoop


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("workers") / "tiny")


@pytest.fixture(scope="module")
def tiny_llm(folder):
    return LLM(str(folder), device="cpu", num_blocks=256, block_size=4)


def replica(llm, **options):
    """serve() with the pool of these tests: 256 frames of 4 tokens."""
    return serve(llm, **{"num_blocks": 256, "block_size": 4} | options)


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def complete(url: str, prompt: str, max_tokens: int = 1, **fields) -> dict:
    response = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            **fields,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response.json()


def hits(url: str) -> float:
    return metric(wait_until_idle(url, seconds=10), "prefix_cache_hits_total")


# ---- what the replica is -------------------------------------------------------------
def test_the_info_routes_say_what_each_router_reads(tiny_llm, folder):
    with replica(tiny_llm, model_path=str(folder)) as url:
        info = httpx.get(f"{url}/get_server_info").json()
        assert httpx.get(f"{url}/server_info").json() == info
        # vllm-router's kv_aware: the model, the replica, the block size of its events
        assert info["model_path"] == str(folder)
        assert info["served_model_name"] == info["model_id"] == "tiny"
        assert info["kv_block_size"] == info["page_size"] == 4
        assert info["instance_id"].startswith("minipaged-")
        assert info["max_total_num_tokens"] == 256 * 4
        assert info["context_length"] == 256 and info["dp_size"] == 1
        model = httpx.get(f"{url}/get_model_info").json()
        assert httpx.get(f"{url}/model_info").json() == model
        config = json.loads((folder / "config.json").read_text())
        assert model == {
            "model_path": str(folder),
            "tokenizer_path": str(folder),
            "is_generation": True,
            "model_type": config["model_type"],
            "architectures": ["LlamaForCausalLM"],
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }
    with replica(tiny_llm) as url:  # two replicas: two instances, one model
        other = httpx.get(f"{url}/get_server_info").json()
        assert other["instance_id"] != info["instance_id"]
        assert other["model_path"] == "tiny"  # no folder given: the served name


# ---- how busy it is ------------------------------------------------------------------
@pytest.fixture(scope="module")
def long_llm(tmp_path_factory):
    """The tiny model with 4,096 positions: a 4,000-token request is still running
    when the probes look, even on a busy machine (one of 200 once ended first)."""
    folder = write_checkpoint(tmp_path_factory.mktemp("long"), max_positions=4096)
    return LLM(str(folder), device="cpu", num_blocks=1100, block_size=4)


def test_get_load_answers_vllm_router_and_under_sglang_sglang_router(long_llm):
    with serve(long_llm, num_blocks=1100, block_size=4) as url:
        assert httpx.get(f"{url}/get_load").json() == {"load": 0}
        # the /sglang mark serves every route, as sglang-router's worker URL
        assert httpx.get(f"{url}/sglang/v1/models").json()["data"][0]["id"] == "tiny"
        with httpx.stream(
            "POST",
            f"{url}/v1/completions",
            json={
                "model": "tiny",
                "prompt": words(1, 20),
                "max_tokens": 4000,
                "ignore_eos": True,
                "stream": True,
            },
            timeout=60,
        ) as stream:
            chunks = stream.iter_lines()
            next(line for line in chunks if line.startswith("data: {"))
            vllm = httpx.get(f"{url}/get_load").json()
            sglang = httpx.get(f"{url}/sglang/get_load").json()
        # the stream closed early: the server aborts the request
        assert vllm == {"load": 1}
        [rank] = sglang
        assert rank["dp_rank"] == 0 and rank["num_reqs"] == 1
        assert rank["num_waiting_reqs"] == 0
        # its frames in use, in tokens: at least its prompt, in whole frames
        assert rank["num_tokens"] >= 20 and rank["num_tokens"] % 4 == 0
        wait_until_idle(url)
        assert httpx.get(f"{url}/sglang/get_load").json() == [
            {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
        ]


def test_health_generate_generates_a_token_or_says_why_not(tiny_llm):
    server = Server(
        tiny_llm.new_engine(num_blocks=256, block_size=4),
        tiny_llm.tokenizer,
        ServerConfig("tiny"),
    )
    with ServerThread(server) as url:
        before = httpx.get(f"{url}/metrics").text
        assert httpx.get(f"{url}/health_generate").status_code == 200
        after = wait_until_idle(url)
        assert metric(after, "generation_tokens_total") == (
            metric(before, "generation_tokens_total") + 1
        )
        server.loop.stop_reason = "the engine loop stopped: RuntimeError: planted"
        answer = httpx.get(f"{url}/health_generate")
        assert answer.status_code == 503
        assert "planted" in answer.json()["error"]["message"]
        server.loop.stop_reason = None


# ---- vLLM's render routes ------------------------------------------------------------
def test_render_routes_give_the_ids_and_params_the_engine_would_run(tiny_llm):
    messages = [{"role": "user", "content": "what is a page table"}]
    with replica(tiny_llm) as url:
        tokens = httpx.post(
            f"{url}/tokenize", json={"model": "tiny", "messages": messages}
        ).json()["tokens"]
        chat = httpx.post(
            f"{url}/v1/chat/completions/render",
            json={"model": "tiny", "messages": messages, "max_tokens": 7, "seed": 3},
        )
        assert chat.status_code == 200, chat.text
        chat = chat.json()
        assert chat["token_ids"] == tokens and chat["model"] == "tiny"
        assert chat["request_id"].startswith("chatcmpl-")
        params = chat["sampling_params"]
        assert (params["max_tokens"], params["seed"], params["n"]) == (7, 3, 1)
        prompts = ["hello world the", "paged frame block"]
        done = httpx.post(
            f"{url}/v1/completions/render",
            json={"model": "tiny", "prompt": prompts, "temperature": 0},
        ).json()
        assert [r["token_ids"] for r in done] == [
            tiny_llm.tokenizer.encode(p) for p in prompts
        ]
        assert {r["sampling_params"]["temperature"] for r in done} == {0}
        assert all(r["sampling_params"]["max_tokens"] == 16 for r in done)
        # checked as the routes they render: each mistake named
        wrong_model = httpx.post(
            f"{url}/v1/completions/render", json={"model": "gpt-4", "prompt": "a"}
        )
        assert wrong_model.status_code == 404 and "gpt-4" in wrong_model.text
        too_long = httpx.post(
            f"{url}/v1/completions/render",
            json={"model": "tiny", "prompt": [5] * 300},
        )
        assert too_long.status_code == 400
        assert too_long.json()["error"]["param"] == "prompt"
        not_json = httpx.post(
            f"{url}/v1/chat/completions/render",
            content="{}",
            headers={"content-type": "text/plain"},
        )
        assert not_json.status_code == 415
        # nothing ran
        text = wait_until_idle(url)
        assert metric(text, "prompt_tokens_total") == 0


# ---- the prefix cache, dropped -------------------------------------------------------
def test_reset_drops_the_parked_blocks_and_the_same_prompt_then_misses(tiny_llm):
    prompt = words(2, 30)
    full_blocks = (len(tiny_llm.tokenizer.encode(prompt)) - 1) // 4
    with replica(tiny_llm) as url:
        complete(url, prompt)
        cold = hits(url)
        complete(url, prompt)
        warm = hits(url)
        assert warm - cold >= full_blocks * 4  # the cache serves it again
        reset = httpx.post(f"{url}/reset_prefix_cache")
        assert reset.status_code == 200
        dropped = reset.json()["dropped_blocks"]
        assert dropped >= full_blocks
        assert f"dropped {dropped} cached blocks" in reset.json()["message"]
        complete(url, prompt)
        assert hits(url) == warm  # nothing of it was left to find
        # SGLang's name for the same reset; a second finds nothing left
        assert httpx.post(f"{url}/flush_cache").json()["dropped_blocks"] >= full_blocks
        assert httpx.post(f"{url}/flush_cache").json()["dropped_blocks"] == 0


def test_reset_keeps_the_blocks_a_running_sequence_maps(tiny_llm):
    parked, running = words(3, 30), words(4, 30)
    with replica(tiny_llm) as url:
        complete(url, parked)
        with httpx.stream(
            "POST",
            f"{url}/v1/completions",
            json={
                "model": "tiny",
                "prompt": running,
                "max_tokens": 200,
                "ignore_eos": True,
                "stream": True,
            },
            timeout=60,
        ) as stream:
            chunks = stream.iter_lines()
            next(line for line in chunks if line.startswith("data: {"))
            dropped = httpx.post(f"{url}/reset_prefix_cache").json()["dropped_blocks"]
            rest = [line for line in chunks if line.startswith("data: {")]
        assert rest, "the request ended before the reset: it mapped nothing then"
        assert dropped >= (len(tiny_llm.tokenizer.encode(parked)) - 1) // 4
        before = hits(url)
        complete(url, running)  # its blocks stayed cached through the reset
        full = (len(tiny_llm.tokenizer.encode(running)) - 1) // 4
        assert hits(url) - before >= full * 4
        before = hits(url)
        complete(url, parked)  # the parked prompt's did not
        assert hits(url) == before


def test_the_reset_wants_the_key_and_a_running_loop(tiny_llm):
    engine = tiny_llm.new_engine(num_blocks=256, block_size=4)
    server = Server(engine, tiny_llm.tokenizer, ServerConfig("tiny", api_key="k"))
    with ServerThread(server) as url:
        refused = httpx.post(f"{url}/flush_cache")
        assert refused.status_code == 401
        key = {"authorization": "Bearer k"}
        assert httpx.post(f"{url}/flush_cache", headers=key).status_code == 200
        server.loop.stop_reason = "the engine loop stopped: RuntimeError: planted"
        stopped = httpx.post(f"{url}/reset_prefix_cache", headers=key)
        assert stopped.status_code == 503 and "planted" in stopped.text
        server.loop.stop_reason = None


def test_loop_call_runs_on_the_engine_thread_and_hands_back_errors(tiny_llm):
    loop = EngineLoop(tiny_llm.new_engine(num_blocks=256, block_size=4)).start()

    def fail(engine):
        raise ValueError("planted")

    async def calls():
        name = await loop.call(lambda engine: threading.current_thread().name)
        with pytest.raises(ValueError, match="planted"):
            await loop.call(fail)
        return name, await loop.call(lambda engine: engine.has_unfinished_requests())

    try:
        assert asyncio.run(calls()) == ("minipaged-engine", False)
    finally:
        loop.stop()


# ---- metrics on a cold replica -------------------------------------------------------
def test_a_cold_replica_has_a_series_in_every_family_and_vllms_older_names(tiny_llm):
    with replica(tiny_llm) as url:
        text = httpx.get(f"{url}/metrics").text
        empty = [f.name for f in text_string_to_metric_families(text) if not f.samples]
        assert not empty, f"families without a series on a cold replica: {empty}"
        for name in ("minipaged", "vllm"):
            assert f"{name}:request_success_total{{" in text
            assert f"{name}:client_tokens_total{{" in text
        complete(url, words(5, 12), max_tokens=3)
        complete(url, words(5, 12), max_tokens=3)
        text = wait_until_idle(url)
        for old, new in (
            ("gpu_prefix_cache_queries_total", "prefix_cache_queries_total"),
            ("gpu_prefix_cache_hits_total", "prefix_cache_hits_total"),
            ("gpu_cache_usage_perc", "kv_cache_usage_perc"),
        ):
            assert metric(text, old) == metric(text, new)
            assert f"vllm:{old}{{" in text
        assert metric(text, "gpu_prefix_cache_hits_total") > 0


# ---- clients behind a proxy ----------------------------------------------------------
async def burst(url: str, bodies: list[dict], headers: list[dict]) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:
        answers = await asyncio.gather(
            *(
                client.post(f"{url}/v1/completions", json=body, headers=head)
                for body, head in zip(bodies, headers)
            )
        )
    return [a.status_code for a in answers]


def request(i: int, **fields) -> dict:
    return {
        "model": "tiny",
        "prompt": words(10 + i, 8),
        "max_tokens": 24,
        "ignore_eos": True,
        **fields,
    }


def test_by_default_a_burst_through_one_address_is_queued_never_refused(tiny_llm):
    with replica(tiny_llm) as url:  # a router: every request from one address
        statuses = asyncio.run(burst(url, [request(i) for i in range(8)], [{}] * 8))
        assert statuses == [200] * 8


def test_a_trusted_proxy_forwards_who_the_client_is(tiny_llm):
    forwarded = [{"x-forwarded-for": f"10.0.0.{i}"} for i in range(8)]
    bodies = [request(i) for i in range(8)]
    # untrusted: the header is the client's say-so, and the bound counts one client
    with replica(tiny_llm, max_concurrent_per_client=2) as url:
        statuses = asyncio.run(burst(url, bodies, forwarded))
        assert statuses.count(429) >= 1
    trusted = {"max_concurrent_per_client": 2, "forwarded_allow_ips": ("127.0.0.1",)}
    with replica(tiny_llm, **trusted) as url:
        assert asyncio.run(burst(url, bodies, forwarded)) == [200] * 8
        text = wait_until_idle(url)
        for i in range(8):  # each forwarded client served and named
            assert f'client="10.0.0.{i}",kind="output"' in text
        # OpenAI's `user` from a trusted caller tells apart clients of one address
        users = [request(i, user=f"user-{i}") for i in range(8)]
        assert asyncio.run(burst(url, users, [{}] * 8)) == [200] * 8


def test_the_forwarded_chain_is_read_from_the_right_past_trusted_proxies():
    proxies = TrustedProxies(("127.0.0.1", "10.0.0.0/8"))
    # the router (10.1.1.1) appended what it saw; the client's own claim is left
    assert proxies.client("127.0.0.1", "6.6.6.6, 192.0.2.7, 10.1.1.1", "ann") == (
        "192.0.2.7",
        "ann",
    )
    assert proxies.client("127.0.0.1", "", None) == ("127.0.0.1", "")
    # an untrusted peer's header and user count for nothing
    assert proxies.client("192.0.2.9", "10.0.0.1", "ann") == ("192.0.2.9", "")
    assert proxies.client("127.0.0.1", "garbage", 7) == ("127.0.0.1", "")
    assert TrustedProxies(("*",)).trusts("2001:db8::1")
    assert not TrustedProxies().trusts("127.0.0.1")


def test_forwarded_allow_ips_is_checked_before_anything_loads(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--forwarded-allow-ips", "127.0.0.1,router"])
    assert "'router' is not an IP address or network" in capsys.readouterr().err
    args = build_parser().parse_args(["--forwarded-allow-ips", "127.0.0.1, 10.0.0.0/8"])
    assert args.forwarded_allow_ips == ("127.0.0.1", "10.0.0.0/8")


# ---- the schema ----------------------------------------------------------------------
def test_every_router_route_is_in_the_schema(tiny_llm):
    with replica(tiny_llm) as url:
        paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    routes = {
        "/get_server_info": "get",
        "/server_info": "get",
        "/get_model_info": "get",
        "/model_info": "get",
        "/get_load": "get",
        "/v1/chat/completions/render": "post",
        "/v1/completions/render": "post",
        "/health_generate": "get",
        "/reset_prefix_cache": "post",
        "/flush_cache": "post",
    }
    for path, method in routes.items():
        assert "200" in paths[path][method]["responses"], path
