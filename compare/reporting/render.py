"""report.md and the terminal tables from report.json: one set of rows, two renderings."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from common.twin.modules import ROOT_MODULE
from common.vocab import BF16_MODE_WORDS, Bf16Mode
from compare.judge.decided import decisions_cell, later_words
from compare.judge.extra_inputs import entered_words
from compare.judge.sensitivity import sensitivity_line
from compare.judge.shards import replica_words
from compare.judge.tensor_error import BORDERLINE, passes_with_words
from compare.reporting.cells import fmt as _fmt
from compare.reporting.check_tables import ops_tables, start_state_tables
from compare.reporting.generation_tables import generation_tables
from compare.reporting.kernel_tables import kernel_tables
from compare.reporting.program_tables import profile_tables, program_tables

# how a tensor row was judged when not element by element in full (its kind column says it)
JUDGED_BY = {"noise-floor": ", noise floor", "summary": ", by summary"}


def _module(found: dict | None) -> str:
    if not found:
        return "-"
    left_out = f"; {len(found['not_compared'])} not compared" if found.get("not_compared") else ""
    shapes = [k for k in found.get("shapes_differ") or () if k != found["module"]]
    # differ only in shape where another module differs in its numbers: never the location
    if shapes:
        left_out += f"; {len(shapes)} differ only in shape ({', '.join(shapes[:3])})"
    if found.get("captured_at"):
        row, token = found["captured_at"]
        left_out += (
            f"; captured from row {row}{f', token {token}' if token else ''}, where the "
            "logits differ most"
        )
    if found.get("in_loss"):  # compare/judge/own_loss.py
        return f"in the loss: {found['in_loss']}"
    if not found["module"]:
        return f"none ({found['modules_compared']} modules agree{left_out})"
    if found.get("entered_through"):  # compare/judge/extra_inputs.py: what it passed on differs
        via = found["entered_through"]
        return (
            f"{found['module']} ({entered_words(via)}: {_size(via['error'])}; "
            f"{via['module']}'s first input agrees; "
            f"{found['modules_diverging']}/{found['modules_compared']} modules differ{left_out})"
        )
    # compare/judge/decided.py: its top-k/argmax/sort chose otherwise, not at a tie
    if found.get("decision"):
        d = found["decision"]
        return (
            f"{found['module']} (its {d['op']} chose otherwise in {d['flipped']} of {d['rows']} "
            "rows, not at a "
            f"tie: margins up to {d['widest_margin']:.2e}, scores {d['scores_max_abs']:.2e} apart)"
        )
    why = "its input agrees, its output does not" if found["input_agrees"] else "its output differs"
    # a module called with several arrays: only the first is captured
    if found.get("inputs_not_compared"):
        why = (
            f"its first input agrees ({found['inputs_not_compared']} more not compared: the "
            "difference may "
            "enter through them), its output does not"
        )
    # agreeing, but barely: the difference may enter upstream
    if (found.get("input_used") or 0) > BORDERLINE:
        why = (
            f"its input agrees at {found['input_used']:.0%} of its bound, its output does not: "
            "the difference "
            "may enter before it (an activation between modules, its parent's own code)"
        )
    if found["module"] == ROOT_MODULE and found["input_agrees"]:
        why = _root_culprit(found.get("not_compared") or {})
    error = found["output_error"]
    size = error.get("note") if error.get("abs") is None else f"max abs {_fmt(error['abs'], '.3e')}"
    if error.get("field"):  # a field of a structured output, shaped as the other side's output
        size += f" ({error['field']})"
    return (
        f"{found['module']} ({why}: {size}; "
        f"{found['modules_diverging']}/{found['modules_compared']} modules "
        f"differ{left_out}{_summaries(found)})"
    )


def _root_culprit(not_compared: dict) -> str:
    """Why the whole model is named: no compared submodule was fed agreeing inputs and gave
    differing outputs. A module left out of the comparison (a container whose name did not match,
    say) may hold the difference."""
    if not not_compared:
        return (
            "the model's own forward code, outside its submodules: each submodule that differs "
            "was fed a "
            "differing input"
        )
    names = sorted(not_compared)
    shown = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
    return (
        f"the model's own forward code or a module not compared ({shown}): each compared "
        "submodule that "
        "differs was fed a differing input"
    )


def _backward(found: dict | None, forward: dict | None = None) -> str:
    # the backward is searched only where the forwards agree (compare/judge/parity.py)
    if not found:
        return (
            "not searched: the forwards part already" if forward and forward.get("module") else "-"
        )
    if found.get("in_loss"):
        return (
            "the loss (the gradient it sends into the model differs: "
            f"{_size(found['input_grad_error'])})"
        )
    roles = (
        f"; {len(found['other_roles'])} whose captured outputs play other roles on the two sides "
        f"({', '.join(found['other_roles'][:3])})"
        if found.get("other_roles")
        else ""
    )
    if not found["module"]:
        return f"none ({found['modules_compared']} modules' gradients agree{roles})"
    why = (
        "the gradient flowing into it agrees, the one it passes back does not"
        if found["output_grad_agrees"]
        else "the gradient flowing into it differs already"
    )
    return (
        f"{found['module']} ({why}: {_size(found['input_grad_error'])}; "
        f"{found['modules_diverging']}/"
        f"{found['modules_compared']} modules differ{roles}{_summaries(found)})"
    )


def _summaries(found: dict) -> str:
    """A location judged on summaries of the activations says so (compare/judge/tensor_error.py
    by_summary)."""
    if not found.get("judged_by"):
        return ""
    return (
        "; found on summaries, confirmed whole"
        if found.get("confirmed_whole")
        else "; by summaries: a difference in unsampled elements can hide"
    )


def _size(error: dict) -> str:
    return error.get("note") if error.get("abs") is None else f"max abs {_fmt(error['abs'], '.3e')}"


def _over(error: dict) -> str:
    """'3 / 1024': the elements over the bound (a tolerance's fraction may allow some), '-'
    unmeasured."""
    return f"{error['over']} / {error['elements']}" if error.get("elements") is not None else "-"


def _kl(d: dict | None) -> str:
    return "-" if not d else f"{_fmt(d['kl_mean'], '.2e')} / {_fmt(d['kl_max'], '.2e')}"


def _topk(d: dict | None) -> str:
    if not d:
        return "-"
    k = next((key for key in d if key.startswith("top") and key != "top1"), None)
    return _fmt(d["top1"], ".2%") + (f" / {_fmt(d[k], '.2%')}" if k else "")


def _curves(c: dict | None) -> str:
    if not c:
        return "-"
    return f"{c['final_gap']:+.3g} / {c['final_band']:.3g} ({c['window']} steps), " + (
        f"parted at step {c['parts_at']}"
        if c["parts_at"] is not None
        else f"within ({c['worst_share']:.0%})"
    )


def parity_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """One column per backend judged against the reference, its worst tensors, and every pair's
    |Δloss|."""
    parity, ref = report["parity"], report["reference"]
    others = list(parity)
    rows = [
        ["verdict"] + ["pass" if parity[n]["passed"] else "fail" for n in others],
        ["settings compared"]
        + [
            "equal"
            if not parity[n]["setting_differences"]
            else "; ".join(parity[n]["setting_differences"])
            for n in others
        ],
        ["first divergent step"] + [_fmt(parity[n]["first_divergent_step"]) for n in others],
        ["first divergent module (step 0)"]
        + [
            f"not located: {parity[n]['capture_failed']}"
            if parity[n].get("capture_failed")
            else _module(parity[n].get("first_divergent_module"))
            for n in others
        ],
        ["first divergent module, backward pass (step 0)"]
        + [
            _backward(
                parity[n].get("first_divergent_module_backward"),
                parity[n].get("first_divergent_module"),
            )
            for n in others
        ],
        *_where_else_rows(parity, others),
        *(
            [
                ["decisions where the runs part"]
                + [
                    later_words(parity[n]["decisions_later"])
                    if parity[n].get("decisions_later")
                    else "-"
                    for n in others
                ]
            ]
            if any(parity[n].get("decisions_later") for n in others)
            else []
        ),
        ["max |Δloss| over steps"]
        + [_fmt((parity[n].get("loss") or {}).get("max_abs"), ".3e") for n in others],
        *(
            [
                ["loss curves (mean over steps): end gap / band, parted at"]
                + [_curves(parity[n].get("curves")) for n in others]
            ]
            if any(parity[n].get("curves") for n in others)
            else []
        ),
        ["step-0 logits: mean / max KL (nats)"]
        + [_kl(parity[n].get("distribution")) for n in others],
        ["step-0 logits: top-1 / top-5 agreement"]
        + [_topk(parity[n].get("distribution")) for n in others],
        ["tensors within tolerance"]
        + [
            f"{sum(t['within'] for t in parity[n]['tensors'].values())}/{len(parity[n]['tensors'])}"
            for n in others
        ],
    ]
    title = f"Parity against {ref} (the reference): overall {report['verdict']}"
    if report.get("parity_mode") == "statistical":
        title = (
            f"The first seed alone, tensor by tensor against {ref} (not the verdict: the "
            "masks differ)"
        )
    out = [(title, ["check", *others], rows)]
    for name in others:
        out.append(
            (
                f"Worst tensors of {name} ({ref} is the reference)",
                [
                    "tensor",
                    "kind",
                    "max abs",
                    "max rel",
                    "of tolerance",
                    "elements over",
                    "within",
                    "smallest passing tolerance",
                ],
                [
                    [
                        w["name"],
                        w["kind"]
                        + JUDGED_BY.get(w.get("judged_by"), "")
                        + (", whole by a 2nd pass" if w.get("second_pass") else ""),
                        _fmt(w["abs"], ".3e"),
                        _fmt(w["rel"], ".3e"),
                        _fmt(w["tolerance_used"], ".1%"),
                        _over(w),
                        "yes" if w["within"] else "NO",
                        passes_with_words(w["passes_with"]).removeprefix("would pass with ")
                        if w.get("passes_with")
                        else "-",
                    ]
                    for w in parity[name]["worst"][:5]
                ],
            )
        )
        unreached = parity[name].get("unreached") or {}
        if unreached:
            final = parity[name]["tensors"]
            out.append(
                (
                    f"Parameters of {name} not judged by their final value: their step-0 gradient "
                    "is rounding "
                    "noise on both sides, so Adam's updates are a random walk "
                    "(compare/judge/unreached.py)",
                    [
                        "parameter",
                        f"step-0 max abs grad, {ref}",
                        f"step-0 max abs grad, {name}",
                        "noise threshold",
                        "final max abs",
                    ],
                    [
                        [
                            p,
                            _fmt(u["reference"], ".2e"),
                            _fmt(u["other"], ".2e"),
                            _fmt(u["threshold"], ".2e"),
                            _fmt((final.get(f"params/{p}") or {}).get("abs"), ".3e"),
                        ]
                        for p, u in unreached.items()
                    ],
                )
            )
        left_out = (parity[name].get("first_divergent_module") or {}).get("not_compared")
        if left_out:
            out.append(
                (
                    f"Step-0 modules of {name} not compared, and why",
                    ["module", "why"],
                    [[m, why] for m, why in left_out.items()],
                )
            )
    pairs = report.get("pairwise_loss") or {}
    if len(pairs) > 1:
        out.append(
            (
                "Max |Δloss| over steps, every pair",
                ["pair", "max |Δloss|"],
                [[pair, _fmt(v, ".3e")] for pair, v in pairs.items()],
            )
        )
    return out


def statistical_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """--parity-mode statistical: the verdict per backend, and every backend's loss band."""
    st, ref = report["statistical"], report["reference"]
    rows = [
        [
            name,
            "pass" if r["passed"] else "FAIL",
            _fmt(r.get("p"), ".3g"),
            _fmt(r.get("mean_difference"), ".3e"),
            r.get("message", ""),
        ]
        for name, r in st["backends"].items()
    ]
    out = [
        (
            f"Statistical parity against {ref}: {st['test']}, {len(st['seeds'])} seeds, pass when "
            "p >= "
            f"{st['alpha']} (the per-seed tensors below differ by design: each framework draws "
            "its own masks)",
            ["backend", "verdict", "p", f"mean loss - {ref}'s", "note"],
            rows,
        )
    ]
    bands = st["bands"]
    if bands:
        last = lambda b, k: _fmt(b[k][-1], ".4f")  # noqa: E731
        out.append(
            (
                "Loss over the seeds at the last step",
                ["backend", "min", "mean", "max"],
                [[n, last(b, "min"), last(b, "mean"), last(b, "max")] for n, b in bands.items()],
            )
        )
    return out


def _where_else_rows(parity: dict, others: list[str]) -> list[list[str]]:
    """The rows of where a pair parts besides its modules, where a pair has one: by device on a
    mesh, by its step-0 choices."""
    rows = []
    if any(parity[n].get("devices") for n in others):
        rows.append(["first divergent device (mesh)"] + [_device_cell(parity[n]) for n in others])
    if any(parity[n].get("decisions") for n in others):
        cells = [decisions_cell(parity[n]) for n in others]
        rows.append(["step-0 decisions (top-k, argmax, sort)"] + cells)
    return rows


def _device_cell(parity: dict) -> str:
    """Where a pair on a mesh parts by device: the first device whose shard of a step-0 gradient
    leaves its bound, and the modules whose replicas differ (compare/judge/shards.py)."""
    devices = parity.get("devices")
    if not devices:
        return "-"
    first = devices.get("first_divergent_device")
    cell = f"device {first}" if first is not None else "every shard within"
    replicas = replica_words(devices)
    return f"{cell}; {replicas}" if replicas else cell


def tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for each table; the markdown and the terminal both render these. A
    table that cannot be rendered (a value of a shape it does not expect) is replaced by one that
    says why: the rest is still shown."""
    out = []
    sections = [
        ("statistical", statistical_tables, report.get("statistical")),
        ("start state", start_state_tables, report.get("start_state")),
        ("ops", ops_tables, report.get("ops")),
        ("parity", parity_tables, report.get("parity")),
        ("generation", generation_tables, report.get("generation")),
        ("kernels", kernel_tables, report.get("kernels")),
        ("backends", backend_tables, True),
        ("compiled step", lambda r: program_tables(r["backends"], _apart(r)), True),
        ("profile", lambda r: profile_tables(r["backends"]), True),
        (
            "ratios",
            lambda r: [
                (
                    "Ratios",
                    ["ratio", "value"],
                    [[k, _fmt(v, ".3f")] for k, v in r["ratios"].items()],
                )
            ],
            report.get("ratios"),
        ),
    ]
    for part, build, wanted in sections:
        if not wanted:
            continue
        try:
            out += build(report)
        except Exception as e:  # one table's failure must not take the report with it
            out.append((f"{part}: could not be rendered", ["why"], [[f"{type(e).__name__}: {e}"]]))
    if report.get("not_built"):
        out.append(
            (
                "Not built, and why",
                ["part", "why"],
                [[p.get("part"), p.get("why")] for p in report["not_built"]],
            )
        )
    return out


def _apart(report: dict) -> str:
    """A side-by-side table's title mark when the backends ran on different devices
    (compare/judge/devices.py)."""
    devices = report.get("devices") or {}
    if devices.get("same", True):
        return ""
    return (
        " - NOT COMPARABLE: each backend's own, on its own device ("
        + ", ".join(f"{n}: {d}" for n, d in devices["devices"].items())
        + ")"
    )


def _tolerance_rows(policy: dict) -> list[list[str]]:
    return [
        [k, _fmt(v["atol"], ".0e"), _fmt(v["rtol"], ".0e"), _fmt(v.get("fraction"), ".3g")]
        for k, v in policy.items()
        if "atol" in v
    ]


def _tolerance_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """The bounds each pair was judged by, only those applied: the run's table where a pair used
    it, and a table of each pair judged otherwise (float32 islands, a runtime's float64
    allowances)."""
    header = ["kind", "atol", "rtol", "fraction"]
    rule = "|a-b| <= atol + rtol*max|ref|, at most fraction of the elements over"
    parity = report.get("parity") or {}
    own = {n: p["tolerances_applied"] for n, p in parity.items() if p.get("tolerances_applied")}
    out = []
    if not parity or len(own) < len(parity):
        out.append(
            (
                f"Tolerances ({report['dtype']}, profile {report['tolerance_profile']}): {rule}",
                header,
                _tolerance_rows(report["tolerances"]),
            )
        )
    for name, policy in own.items():
        why = [*(parity[name].get("float64_allowances") or {})]
        if parity[name].get("float32_islands"):
            why.append("float32 islands: float32's bounds, float64's before the first island")
        out.append(
            (
                f"Tolerances applied to {report['reference']} vs {name} ({'; '.join(why)}): {rule}",
                header,
                _tolerance_rows(policy)
                + [
                    [f"{k} before the first island", *_tolerance_rows({k: v})[0][1:]]
                    for k, v in (policy.get("before_islands") or {}).items()
                ],
            )
        )
    return out


def backend_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """Tolerances, compiles, step time, wall time and memory, per backend."""
    out = []
    b = report["backends"]
    names = list(b)
    rows = [
        ["status"]
        + [
            f"{b[n]['status']}" + (f" ({b[n]['message']})" if b[n].get("message") else "")
            for n in names
        ]
    ]
    out += _tolerance_tables(report)
    # the distribution bounds applied: the run's, or those every pair was judged by instead
    applied = [p.get("tolerances_applied") for p in (report.get("parity") or {}).values()]
    tol = applied[0] if applied and all(applied) else report["tolerances"]
    floor = report.get("tolerance_policy") or {}
    if floor.get("policy") == "noise-floor":
        twin = "in float32" if report["dtype"] == "bfloat16" else "from jittered start weights"
        out.append(
            (
                f"{report['dtype']} {report.get('bf16_mode') or ''}".rstrip()
                + " judged by measured noise (compare/judge/noise_floor.py): "
                f"{floor['rule']}, "
                f"factor {floor['factor']:g}; the backends ran once more {twin} "
                f"({floor['floor_runs']})" + (f", {floor['why']}" if floor.get("why") else ""),
                ["backend without a floor run", "why"],
                [[n, why] for n, why in floor["not_measured"].items()] or [["-", "-"]],
            )
        )
    if "distribution" in tol:
        d = tol["distribution"]
        out.append(
            (
                "Step-0 logits as distributions: pass when mean KL(ref || other) <= kl_mean and "
                "top-1 "
                "agreement >= top1",
                ["kl_mean (nats)", "top1"],
                [[_fmt(d["kl_mean"], ".0e"), _fmt(d["top1"], ".3g")]],
            )
        )
    comp = lambda n, k: _fmt((b[n].get("compiles") or {}).get(k))  # noqa: E731
    rows_c = [
        ["setup compiles"] + [comp(n, "setup") for n in names],
        ["loop compiles"] + [comp(n, "loop") for n in names],
        ["steady-state recompiles"] + [comp(n, "steady_state") for n in names],
        ["of these, persistent-cache hits"] + [comp(n, "cache_hits") for n in names],
        ["compile time (s)"]
        + [_fmt((b[n].get("compiles") or {}).get("compile_s"), ".2f") for n in names],
    ]
    apart = _apart(report)
    out.append(("Compiles" + apart, ["", *names], rows + rows_c))
    causes = [
        [n, c["step"], c.get("kind", "-"), c["cause"][:300], (c.get("framework") or "")[:160]]
        for n in names
        for c in (b[n].get("compiles") or {}).get("causes", [])
    ]
    if causes:
        out.append(
            (
                "Steady-state recompiles and their causes",
                ["backend", "step", "cause", "in words", "the framework's own words"],
                causes,
            )
        )
    sm = lambda n, k: _fmt((b[n].get("step_ms") or {}).get(k), ".3f")  # noqa: E731
    tp = lambda n, k: _fmt((b[n].get("throughput") or {}).get(k), ".4g")  # noqa: E731
    rows_t = [
        ["median step (ms, synced)"] + [sm(n, "median") for n in names],
        ["p10 / p90 (ms)"] + [f"{sm(n, 'p10')} / {sm(n, 'p90')}" for n in names],
        ["tracing median (ms)"]
        + [_fmt((b[n].get("trace_ms") or {}).get("median"), ".3f") for n in names],
        ["pipelined steps/s"] + [tp(n, "steps_per_s") for n in names],
        ["examples/s"] + [tp(n, "examples_per_s") for n in names],
        ["tokens/s"] + [tp(n, "tokens_per_s") for n in names],
        ["matmul Gflop/step per device (HLO; eager torch: FlopCounterMode)"]
        + [_fmt((b[n].get("flops_per_step") or 0) / 1e9 or None, ".4g") for n in names],
        ["MFU"] + [_fmt(b[n].get("mfu"), ".2%") for n in names],
    ]
    out.append(("Step time (warm-up steps excluded)" + apart, ["", *names], rows_t))
    wall = lambda n, k: _fmt((b[n].get("wall_breakdown") or {}).get(k), ".2f")  # noqa: E731
    on = lambda n, k: _fmt((b[n].get("platform") or {}).get(k))  # noqa: E731
    rows_w = [
        ["devices / processes"]
        + [f"{on(n, 'device_count')} / {on(n, 'process_count')}" for n in names],
        ["trace mode (torch_xla)"] + [_fmt(b[n].get("trace_mode")) for n in names],
        ["interpreter start + imports (s)"]
        + [_imports(b[n].get("wall_breakdown") or {}) for n in names],
        ["compile (s)"] + [wall(n, "compile_s") for n in names],
        ["steps, synced + pipelined (s)"] + [wall(n, "steps_s") for n in names],
        ["other: init, parity tensors, HLO, record (s)"] + [wall(n, "other_s") for n in names],
        ["backend process total (s)"] + [wall(n, "total_s") for n in names],
        ["peak host RSS (MiB)"] + [_fmt(b[n].get("peak_rss_mb"), ".0f") for n in names],
    ]
    out.append(("Wall time and memory per backend process" + apart, ["", *names], rows_w))
    return out


def _imports(wall: dict) -> str:
    """The start + imports cell: a run its describe step's process made paid them there, before it
    was handed."""
    cell = _fmt(wall.get("start_and_imports_s"), ".2f")
    return (
        cell
        if wall.get("described_s") is None
        else f"{cell} (paid describing: that process had run {wall['described_s']:.2f} s)"
    )


def device_line(report: dict) -> str:
    """The device(s) the backends ran on, for the report's header."""
    devices = report.get("devices") or {}
    named = devices.get("devices") or {}
    if devices.get("same") and named:
        return f"Device: {next(iter(named.values()))} (every backend)"
    return (
        "Devices: "
        + (", ".join(f"{n} on {d}" for n, d in named.items()) or "unknown")
        + (" (different: timings not comparable)" if named else "")
    )


def precision_line(report: dict) -> str:
    """What precision the backends ran in: the dtype, a bfloat16 run's mode (common.vocab.Bf16Mode)
    and the parameters' dtypes each model held."""
    mode = report.get("bf16_mode")
    words = BF16_MODE_WORDS[Bf16Mode(mode)] if mode else report["dtype"]
    held = "; ".join(
        f"{n} " + ", ".join(f"{count} {dtype}" for dtype, count in dtypes.items())
        for n, dtypes in (report.get("param_dtypes") or {}).items()
    )
    return f"Precision: {words}" + (f"; parameters held: {held}" if held else "")


def sensitivity_lines(report: dict) -> list[str]:
    """What each judged backend's verdict could have seen (compare/judge/sensitivity.py), one line
    each."""
    parity = report.get("parity") or {}
    decode = ((report.get("generation") or {}).get("pairs")) or {}
    return [
        f"{name}: {sensitivity_line(p, report.get('dtype', 'float32'))}"
        + (
            f"; its decode path: {decode[name]['sensitivity']:.0e} in the logits at every step"
            if (decode.get(name) or {}).get("sensitivity")
            else ""
        )
        for name, p in parity.items()
        if p.get("checked")
    ]


def markdown(report: dict) -> str:
    """report.md. Every table renders or says why it could not (`tables`)."""
    lines = [
        f"# Parity report: {report['spec_name']}",
        "",
        f"**Verdict: {report['verdict']}** (status `{report['status']}`, exit code "
        f"{report['exit_code']})",
        "",
    ]
    if report.get("message"):
        lines += [report["message"], ""]
    lines += (
        [*(f"- {line}" for line in sensitivity_lines(report)), ""]
        if sensitivity_lines(report)
        else []
    )
    lines += [device_line(report), "", precision_line(report), ""]
    lines += [f"Start weights: {report['weights']}.", ""] if report.get("weights") else []
    for title, header, rows in tables(report):
        lines += [
            f"## {title}",
            "",
            "| " + " | ".join(h.replace("|", "\\|") for h in header) + " |",
            "|" + "---|" * len(header),
        ]
        lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
        lines.append("")
    peaks = {n: b.get("peak_source") for n, b in report["backends"].items() if b.get("peak_source")}
    if peaks:
        lines += [
            "MFU = HLO dot/convolution flops per step / median synced step time / peak: "
            + "; ".join(f"{n}: {s}" for n, s in peaks.items()),
            "",
        ]
    plots = report.get("plots") or []
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def print_tables(report: dict, console: Console | None = None) -> None:
    console = console or Console(markup=False)  # text is data: "[/x.cc:1]" is no tag
    for title, header, rows in tables(report):
        table = Table(title=title, title_justify="left")
        for h in header:
            # a narrow terminal wraps a tensor's name, never cuts it
            table.add_column(h, overflow="fold")
        for row in rows:
            table.add_row(*[str(c) for c in row])
        console.print(table)
    style = "bold green" if report["verdict"] == "pass" else "bold red"
    console.print(device_line(report))
    console.print(precision_line(report))
    for line in sensitivity_lines(report):
        console.print(line)
    console.print(
        f"verdict: {report['verdict']} ({report['status']})  report: {report['run_dir']}",
        style=style,
    )
