# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 16. Automata: structured output as a finite-state machine over tokens
#
# **What you will see** (about 10 minutes):
# - a regular expression built into an automaton (Kleene 1956; Thompson, CACM 1968), and its
#   deterministic states found one character at a time;
# - the vocabulary walked from a state: which of SmolLM2's 49,152 tokens keep the text a prefix
#   of a match (the state's mask);
# - SmolLM2 answering in JSON that fits a schema, because the sampler only sees allowed tokens.

# %%
import json

import numpy as np

from minipaged import LLM, SamplingParams
from minipaged.sampling import StructuredOutputsParams
from minipaged.structured import compile_regex, regex_of

# %% [markdown]
# ## A pattern is a machine
# Each character moves the automaton to a new state, a set of Thompson's NFA states; a text
# no match starts with reaches DEAD (-1).

# %%
date = compile_regex(r"\d{4}-(0[1-9]|1[0-2])-\d{2}")
state = date.start
for ch in "1969-07-20":
    state = date.step(state, ch)
    print(f"{ch!r} -> state {state} (NFA states {sorted(date.sets[state])[:6]}...)")
print(
    "a whole match:",
    date.accepting(state),
    "| '1969-13' dies at:",
    date.walk(date.start, "1969-13"),
)

# %% [markdown]
# ## A state's mask: the tokens that keep the text alive

# %%
llm = LLM()  # SmolLM2-135M-Instruct, float32 on a CPU
automata = llm.engine.constrainer()
constraint = automata.compile(
    StructuredOutputsParams(regex=r"\d{4}-(0[1-9]|1[0-2])-\d{2}")
)
for token in llm.tokenizer.encode("1969-0", add_special_tokens=False):
    allowed = constraint.allowed()
    print(
        f"{int(allowed.sum()):6} tokens allowed, e.g. {[automata.texts[t] for t in np.flatnonzero(allowed)[:5]]}"
    )
    constraint.advance(token)

# %% [markdown]
# ## The model, held to a schema

# %%
schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
    },
    "required": ["name", "age"],
}
prompt = llm.tokenizer.encode_chat(
    [{"role": "user", "content": "Describe a cat as JSON with a name and an age."}]
)
free, held = llm.generate(
    [{"prompt_token_ids": prompt}] * 2,
    [
        SamplingParams(temperature=0, max_tokens=48),
        SamplingParams(
            temperature=0,
            max_tokens=48,
            structured_outputs=StructuredOutputsParams(json=schema),
        ),
    ],
    use_tqdm=False,
)
print("without:", free.outputs[0].text[:120])
print("with:   ", held.outputs[0].text, "->", json.loads(held.outputs[0].text))
print("its pattern starts:", regex_of(StructuredOutputsParams(json=schema))[:70])

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** How many DFA states did the held answer above visit, and how many tokens did
# the widest state allow? (The Automaton behind a constraint caches one mask per state.)

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# automaton = automata.compile(StructuredOutputsParams(json=schema)).automaton
# print(len(automaton.masks), "states,", max(int(m.sum()) for m in automaton.masks.values()), "tokens at most")
# # inside a string nearly the whole vocabulary is allowed; between keys only a few tokens
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Hold SmolLM2 to a choice of three answers with `n=3` samples. Does every
# sample give one of them?

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# spec = StructuredOutputsParams(choice=["yes", "no", "maybe"])
# out = llm.generate(["Is the sky blue?"], SamplingParams(n=3, temperature=1.0, seed=0, max_tokens=4,
#                                                        structured_outputs=spec), use_tqdm=False)[0]
# print([c.text for c in out.outputs])   # each sample walks its own state of one automaton
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 14, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 14** (about 25 minutes): the subset construction's step: the closure of a set of NFA states and its move on a character.
#
#   ```
#   cp labs/lab14_subsets.py my_subsets.py
#   python -m minipaged.lab check 14 my_subsets.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 14` shows the next hint, one at a time, from the idea to the code.
