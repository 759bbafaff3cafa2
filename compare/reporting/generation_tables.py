"""The tables of --generate (compare/judge/generation.py): each side's decode path against the
reference's step by step, each against its own forward, and where a greedy choice first differs."""

from __future__ import annotations

from compare.reporting.cells import fmt

SHOWN_STEPS = 32  # rows of the per-step table; report.json has every step


def _cell(check: dict) -> str:
    cell = f"{fmt(check['max_abs'], '.2e')} / {fmt(check['bound'], '.1e')}"
    return f"{cell}, KL {fmt(check['kl'], '.1e')}" if "kl" in check else cell


def generation_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    section = report["generation"]
    ref, pairs, own = section["reference"], section["pairs"], section["self"]
    names = [*own]
    title = (
        f"Generation: {section['new_tokens']} greedy tokens after prompts of "
        f"{', '.join(map(str, section['prompt_lengths']))} tokens (left-padded), every side fed "
        f"{ref}'s tokens: max |Δlogits| / bound and the mean KL({ref} || side) of the next token "
        f"against {ref}, and against the side's own forward"
        + (
            " (bounds: 3x the measured noise, each side's distance from its own float32 run)"
            if section.get("judged_by") == "noise-floor"
            else ""
        )
    )
    header = [
        "step",
        *(f"{n} vs {ref}" for n in pairs),
        *(f"{n}: decode vs its forward" for n in names),
    ]
    rows = [["prefill", *(_cell(c["prefill"]) for c in pairs.values()), *(["-"] * len(names))]]
    n_steps = len(next(iter(own.values()))["steps"]) if own else 0
    for s in range(min(n_steps, SHOWN_STEPS)):
        rows.append(
            [
                str(s),
                *(_cell(c["steps"][s]) for c in pairs.values()),
                *(_cell(own[n]["steps"][s]) for n in names),
            ]
        )
    verdicts = [
        "verdict",
        *(_pair_verdict(c) for c in pairs.values()),
        *(_self_verdict(own[n]) for n in names),
    ]
    out = [(title, header, [verdicts, *rows])]
    runtime = section.get("runtime") or {}
    if runtime:
        out.append(
            (
                "Generation cost: time to the first token's logits, the median decode step, and "
                "graphs compiled by the prefill / the first decode step / every later one (where "
                "the runtime counts them)",
                ["backend", "decode path", "prefill ms", "decode step ms (median)", "compiles"],
                [
                    [
                        n,
                        f.get("how") or "-",
                        fmt(f["prefill_ms"], ".1f"),
                        fmt(f["decode_ms_median"], ".1f"),
                        " / ".join(str(v) for v in f["compiles"].values())
                        if "compiles" in f
                        else "-",
                    ]
                    for n, f in runtime.items()
                ],
            )
        )
    if section["not_run"]:
        out.append(
            (
                "Generation not run",
                ["backend", "why"],
                [[n, w] for n, w in section["not_run"].items()],
            )
        )
    return out


def _where(step) -> str:
    return "the prefill" if step == "prefill" else f"step {step}"


def _pair_verdict(check: dict) -> str:
    flip = check["first_flip"]
    said = "pass" if check["passed"] else f"fail from {_where(check['first_divergent_step'])}"
    found = check.get("first_divergent_module") or {}
    if found.get("module"):
        fed = " (its input agrees)" if found["input_agrees"] else ""
        said += f", first at {found['module']}{fed}"
    if flip:
        said += (
            f"; its own choice first differs at step {flip['step']}, prompt {flip['prompt']} "
            f"({flip['token']} for {flip['reference_token']}; margins "
            f"{fmt(flip['margin_other'], '.1e')} / {fmt(flip['margin_reference'], '.1e')}"
            + (", a near-tie: within rounding)" if flip["within_rounding"] else ")")
        )
    return said


def _self_verdict(check: dict) -> str:
    if check["first_divergent_step"] is not None:
        step = check["first_divergent_step"]
        return f"fail: the decode path differs from its own forward from step {step}"
    forward = check["forward"]
    if forward["within"] is False:
        return f"fail: its prefill differs from its training forward ({_cell(forward)})"
    return "pass"
