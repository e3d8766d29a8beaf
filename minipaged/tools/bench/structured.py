"""`python -m minipaged.bench structured`: automata, structured output held by the mask.

On the real model, per task (a JSON schema, a tool's arguments, any JSON object, a
regex, a choice): the share of sampled answers that parse and fit, without the automaton
and with it; then what the mask costs: compiling, a state's first mask, a step's masking
at batch 1 and 16.
"""

from __future__ import annotations

import json
import re
import time

import numpy as np
from tqdm import tqdm

from minipaged.llm import number
from minipaged.sampling import SamplingParams, StructuredOutputsParams, held
from minipaged.tools.bench.common import load, model_arguments
from minipaged.tools.viz import BarChart

EMPLOYEE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "skills": {
            "type": "array",
            "items": {"type": "string", "maxLength": 16},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "skills"],
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
LANGUAGES = ["Python", "Rust", "C++", "Go", "Java", "Haskell"]
TASKS = [  # name, the user's message (the format asked in words too), the constraint
    (
        "employee JSON",
        (
            "Give an example JSON object for an employee profile with the keys name,"
            " age and skills (a list). Only the JSON."
        ),
        {"json": EMPLOYEE},
    ),
    (
        "tool arguments",
        (
            "Call get_weather for Paris. Reply with the JSON arguments only, like"
            ' {"city": ..., "unit": "celsius"}.'
        ),
        {"json": WEATHER},
    ),
    (
        "any JSON object",
        "Describe a cat as a JSON object. Only the JSON.",
        {"json_object": True},
    ),
    (
        "date regex",
        (
            "On which date did the Apollo 11 mission land on the Moon? Answer as"
            " YYYY-MM-DD only."
        ),
        {"regex": DATE},
    ),
    (
        "choice",
        "Which language is best for type-safe systems programming? Answer with one of: "
        + ", ".join(LANGUAGES)
        + ". Only the name.",
        {"choice": LANGUAGES},
    ),
]


def add_arguments(parser) -> None:
    parser.add_argument(
        "--samples",
        type=number(int, 1),
        default=4,
        help=(
            "sampled answers per task, with and without the automaton (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--max-tokens",
        type=number(int, 8),
        default=96,
        help="tokens per answer (default %(default)s)",
    )
    parser.add_argument(
        "--svg",
        default=None,
        help="also write the valid share per task (a bar chart) to this SVG",
    )
    model_arguments(parser)


def fits(value, schema: dict) -> bool:
    """Does a JSON value fit a schema of the subset TASKS use (type, properties,
    required, items, maxItems, maxLength, enum)? The judge of the answers, independent
    of the automaton.
    """
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return (
            isinstance(value, dict)
            and set(schema.get("required", [])) <= set(value)
            and (not props or set(value) <= set(props))
            and all(fits(value[k], props[k]) for k in value if k in props)
        )
    if kind == "array":
        return (
            isinstance(value, list)
            and len(value) <= schema.get("maxItems", len(value))
            and all(fits(v, schema.get("items", {})) for v in value)
        )
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get(
            "maxLength", len(value)
        )
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return kind is None


def valid(text: str, spec: dict) -> bool:
    """Is an answer's text what the constraint asks for?"""
    if "regex" in spec:
        return re.fullmatch(spec["regex"], text) is not None
    if "choice" in spec:
        return text in spec["choice"]
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(value, dict)
        if spec.get("json_object")
        else fits(value, spec["json"])
    )


def answers(
    llm, held_to: bool, samples: int, max_tokens: int, quiet: bool
) -> list[list[str]]:
    """Per task, `samples` answers (temperature 0.7, seeded), held to the constraint or
    not (an unheld one without its surrounding spaces and code fence: the baseline at
    its best).
    """
    prompts = [
        llm.tokenizer.encode_chat([{"role": "user", "content": message}])
        for _, message, _ in TASKS
    ]
    params = [
        SamplingParams(
            n=samples,
            temperature=0.7,
            seed=i,
            max_tokens=max_tokens,
            structured_outputs=StructuredOutputsParams(**spec) if held_to else None,
        )
        for i, (*_, spec) in enumerate(TASKS)
    ]
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=not quiet
    )
    return [
        [c.text if held_to else unfenced(c.text) for c in out.outputs]
        for out in outputs
    ]


def unfenced(text: str) -> str:
    """An unheld answer, judged generously: without the spaces and the ```json fence
    around it."""
    return re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())


def mask_cost(llm, batch: int, repeats: int = 20) -> dict:
    """Seconds per step of holding `batch` rows (each at a cached state: allowed() then
    the -inf mask, sampling.held) next to a decode step's forward at that batch."""
    constraint = llm.engine.constrainer().compile(
        StructuredOutputsParams(json=EMPLOYEE)
    )
    for token in llm.tokenizer.encode('{"name": "Ada', add_special_tokens=False):
        constraint.advance(token)  # inside a string: the widest state
    rows = [constraint.fork() for _ in range(batch)]
    logits = (
        np.random.default_rng(0)
        .standard_normal((batch, llm.model.config.vocab_size))
        .astype(np.float32)
    )
    held(logits, rows)  # the state's mask, computed once and cached
    start = time.perf_counter()
    for _ in range(repeats):
        held(logits, rows)
    mask = (time.perf_counter() - start) / repeats
    engine = llm.new_engine(num_blocks=64 * batch)
    for i in range(batch):
        engine.add_request(
            str(i),
            {"prompt_token_ids": [1, 2, 3, 4]},
            SamplingParams(max_tokens=12, ignore_eos=True),
        )
    engine.step()
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    step = (time.perf_counter() - start) / steps
    return {
        "batch": batch,
        "mask_s": mask,
        "step_s": step,
        "share_of_step": mask / step,
    }


def compile_cost(llm) -> dict:
    """Compiling the employee schema (a fresh backend: nothing cached) and its first
    masks."""
    backend = type(llm.engine.constrainer())(
        llm.tokenizer, llm.model.config.vocab_size, llm.engine.eos_token_ids
    )
    start = time.perf_counter()
    constraint = backend.compile(StructuredOutputsParams(json=EMPLOYEE))
    compiled = time.perf_counter() - start
    firsts = []
    for token in llm.tokenizer.encode(
        '{"name": "Ada", "age": 36', add_special_tokens=False
    ):
        start = time.perf_counter()
        constraint.allowed()
        firsts.append(time.perf_counter() - start)
        constraint.advance(token)
    return {
        "compile_s": compiled,
        "first_mask_s_median": float(np.median(firsts)),
        "first_mask_s_max": float(max(firsts)),
        "states_walked": len(firsts),
    }


def bench_structured(args) -> dict:
    """Per task the valid share without and with the automaton; the mask's costs."""
    llm, threads = load(args)
    report = {
        "model": llm.model_name,
        "device": llm.device,
        "blas_threads": threads,
        "samples": args.samples,
        "max_tokens": args.max_tokens,
    }
    runs = {
        held_to: answers(llm, held_to, args.samples, args.max_tokens, args.json)
        for held_to in tqdm(
            (False, True), desc="without, with the automaton", disable=args.json
        )
    }
    report["tasks"] = [
        {
            "task": name,
            "constraint": spec,
            "valid_without": sum(valid(t, spec) for t in runs[False][i]) / args.samples,
            "valid_with": sum(valid(t, spec) for t in runs[True][i]) / args.samples,
            "answers_with": runs[True][i],
            "answers_without": runs[False][i],
        }
        for i, (name, _, spec) in enumerate(TASKS)
    ]
    report["compile"] = compile_cost(llm)
    report["mask"] = [mask_cost(llm, batch) for batch in (1, 16)]
    if not args.json:
        print_report(report)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(valid_chart(report).svg())
    return report


def valid_chart(report: dict) -> BarChart:
    """The meeting's figure: per task, the share of answers that parse and fit, without
    and with."""
    labels = [
        f"{t['task']} {way}" for t in report["tasks"] for way in ("without", "with")
    ]
    values = [
        100 * t[f"valid_{way}"] for t in report["tasks"] for way in ("without", "with")
    ]
    return BarChart(
        f"answers that parse and fit, {report['model'].split('/')[-1]}, without and"
        " with the automaton",
        labels,
        {"valid": values},
        unit="%",
        digits=0,
    )


def print_report(report: dict) -> None:
    print(
        f"{report['model']} on {report['device']}, {report['samples']} samples per"
        " task\n"
    )
    print(f"{'task':<18} {'valid without':>14} {'valid with':>11}  an answer with")
    for t in report["tasks"]:
        print(
            f"{t['task']:<18} {100 * t['valid_without']:>13.0f}%"
            f" {100 * t['valid_with']:>10.0f}%  {t['answers_with'][0][:60]!r}"
        )
    c = report["compile"]
    print(
        f"\ncompile the employee schema: {1e3 * c['compile_s']:.1f} ms; a new state's"
        f" first mask: median {1e3 * c['first_mask_s_median']:.1f} ms, longest"
        f" {1e3 * c['first_mask_s_max']:.1f} ms"
    )
    for m in report["mask"]:
        print(
            f"batch {m['batch']:>2}: masking {1e3 * m['mask_s']:.2f} ms a step,"
            f" {100 * m['share_of_step']:.1f}% of a {1e3 * m['step_s']:.0f} ms decode"
            " step"
        )
