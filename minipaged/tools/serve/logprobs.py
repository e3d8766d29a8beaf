"""Logprobs in the answers, as OpenAI's and vLLM's servers write them.

The engine gives, per token, a dict token id -> Logprob (CompletionOutput.logprobs, and
RequestOutput.prompt_logprobs for the prompt); here they become chat's `content` list,
completions' four parallel lists (with echo, the prompt's first) and vLLM's
`prompt_logprobs`.
"""

from __future__ import annotations

FLOOR = -9999.0  # vLLM's stand-in for -infinity, which JSON cannot write


def token_name(tokenizer, token_id: int, as_token_id: bool = False) -> str:
    """A token as the answer names it: its text alone, or vLLM's 'token_id:{id}'
    (return_tokens_as_token_ids)."""
    return (
        f"token_id:{token_id}"
        if as_token_id
        else tokenizer.decode([token_id], skip_special_tokens=False)
    )


def _name(tokenizer, token_id: int, logprob, as_token_id: bool) -> str:
    if as_token_id or logprob.decoded_token is None:
        return token_name(tokenizer, token_id, as_token_id)
    return logprob.decoded_token


def chat_logprobs(
    token_ids: list[int],
    logprobs: list[dict],
    num_top: int,
    tokenizer,
    as_token_ids: bool = False,
) -> dict:
    """choices[i].logprobs of a chat answer: per token its text, logprob and UTF-8
    bytes, and
    the `num_top` likeliest tokens there, likeliest first (OpenAI's top_logprobs)."""

    def entry(t: int, lp) -> dict:
        name = _name(tokenizer, t, lp, as_token_ids)
        return {
            "token": name,
            "logprob": max(lp.logprob, FLOOR),
            "bytes": list(name.encode("utf-8", "replace")),
        }

    content = []
    for token_id, step in zip(token_ids, logprobs):
        top = sorted(step.items(), key=lambda item: item[1].rank)[:num_top]
        content.append(
            entry(token_id, step[token_id])
            | {"top_logprobs": [entry(t, lp) for t, lp in top]}
        )
    return {"content": content}


def completion_logprobs(
    token_ids: list[int],
    logprobs: list[dict | None],
    num_top: int,
    tokenizer,
    as_token_ids: bool = False,
    offset: int = 0,
) -> dict:
    """choices[i].logprobs of a completion: tokens, token_logprobs, top_logprobs (the
    token's own and the `num_top` likeliest, OpenAI's up to num_top + 1) and text_offset
    (where each token's text starts, counted as vLLM counts it: the lengths of the
    tokens before). A None step (the prompt's first token, with echo) has no logprob. A
    stream's chunk starts at `offset`.
    """
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, step in zip(token_ids, logprobs):
        if step is None:
            name, logprob, top = (
                token_name(tokenizer, token_id, as_token_ids),
                None,
                None,
            )
        else:
            name, logprob = (
                _name(tokenizer, token_id, step[token_id], as_token_ids),
                max(step[token_id].logprob, FLOOR),
            )
            top = {
                _name(tokenizer, t, lp, as_token_ids): max(lp.logprob, FLOOR)
                for t, lp in list(step.items())[: num_top + 1]
            }  # the token's own first, then the likeliest
        for key, value in zip(out, (name, logprob, top, offset)):
            out[key].append(value)
        offset += len(name)
    return out


def prompt_logprobs(steps: list[dict | None] | None) -> list | None:
    """vLLM's prompt_logprobs: per prompt token None (the first) or {token id: {logprob,
    rank, decoded_token}}."""
    if steps is None:
        return None
    return [
        (
            None
            if step is None
            else {
                str(t): {
                    "logprob": max(lp.logprob, FLOOR),
                    "rank": lp.rank,
                    "decoded_token": lp.decoded_token,
                }
                for t, lp in step.items()
            }
        )
        for step in steps
    ]


def completion_fields(body, output, completion, tokenizer) -> dict:
    """What a completions choice adds for echo and logprobs: the text with the prompt's
    first (echo), `logprobs` (with echo, the prompt's tokens first) and vLLM's
    `prompt_logprobs`.
    """
    as_ids = bool(getattr(body, "return_tokens_as_token_ids", False))
    fields, token_ids, steps = {}, completion.token_ids, completion.logprobs
    if body.echo:
        prompt = (
            output.prompt
            if output.prompt is not None
            else tokenizer.decode(output.prompt_token_ids, skip_special_tokens=False)
        )  # as vLLM echoes token ids
        fields["text"] = prompt + completion.text
        token_ids = output.prompt_token_ids + token_ids
        steps = (
            None
            if steps is None
            else (output.prompt_logprobs or [None] * len(output.prompt_token_ids))
            + steps
        )
    if body.logprobs is not None:
        fields["logprobs"] = completion_logprobs(
            token_ids, steps, body.logprobs, tokenizer, as_ids
        )
    # vLLM's choice always has the field: null unless prompt_logprobs were asked for
    fields["prompt_logprobs"] = (
        None
        if output.prompt_logprobs is None
        else prompt_logprobs(output.prompt_logprobs)
    )
    return fields


def chat_fields(body, completion, tokenizer) -> dict:
    """What a chat choice adds for logprobs: choices[i].logprobs."""
    if not body.logprobs:
        return {}
    as_ids = bool(getattr(body, "return_tokens_as_token_ids", False))
    return {
        "logprobs": chat_logprobs(
            completion.token_ids,
            completion.logprobs,
            body.top_logprobs or 0,
            tokenizer,
            as_ids,
        )
    }
