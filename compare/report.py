"""report.json (stable keys), report.md and the terminal tables: one set of rows, three renderings.

report.json keys (schema_version 1):
  verdict                 "pass" | "fail"
  status                  ok | parity_failed | not_comparable | backend_failed | usage_error | interrupted
  exit_code               what `python -m compare` returned
  tolerances              {kind: {atol, rtol}} used for this dtype
  parity                  null when only one backend ran, else
    .checked, .comparable, .setting_differences, .intended_differences,
    .first_divergent_step (null when none), .loss {max_abs, per_step_abs, steps_compared},
    .tensors {"<group>/<name>": {abs, rel, within, kind}}, .worst [10 worst], .passed
  backends.<name>         status, message, exit_code, wall_s, record, logs,
    .compiles {setup, loop, steady_state, settle_steps, compile_s, causes},
    .step_ms {median, p10, p90, min, max, n}, .trace_ms (torch_xla), .throughput,
    .flops_per_step, .peak_flops, .peak_source, .mfu, .hlo_ops, .losses, .peak_rss_mb, .trace_mode,
    .wall_breakdown {start_and_imports_s, compile_s, steps_s, other_s, total_s}
  wall_time               compare_imports_s, backends_s, report_s, total_s (compare's own process)
  ratios                  torch_xla / jax for step time, jax / torch_xla for throughput
"""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

REPORT_SCHEMA = 1


def _fmt(value, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def ratios(backends: dict) -> dict:
    jax, torch = backends.get("jax", {}), backends.get("torch_xla", {})
    out = {}
    if (jax.get("step_ms") or {}).get("median") and (torch.get("step_ms") or {}).get("median"):
        out["step_ms_median_torch_xla_over_jax"] = torch["step_ms"]["median"] / jax["step_ms"]["median"]
    jt, tt = (jax.get("throughput") or {}).get("steps_per_s"), (torch.get("throughput") or {}).get("steps_per_s")
    if jt and tt:
        out["throughput_jax_over_torch_xla"] = jt / tt
    return out


def tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for each table; the markdown and the terminal both render these."""
    out = []
    b = report["backends"]
    names = list(b)
    rows = [["status"] + [f"{b[n]['status']}" + (f" ({b[n]['message']})" if b[n].get("message") else "")
                          for n in names]]
    if report.get("parity"):
        p = report["parity"]
        out.append(("Parity", ["check", "result"], [
            ["verdict", report["verdict"]],
            ["settings compared", "equal" if not p["setting_differences"] else "; ".join(p["setting_differences"])],
            ["first divergent step", _fmt(p["first_divergent_step"])],
            ["max |Δloss| over steps", _fmt((p.get("loss") or {}).get("max_abs"), ".3e")],
            ["tensors within tolerance", f"{sum(t['within'] for t in p['tensors'].values())}/{len(p['tensors'])}"],
        ]))
        out.append(("Worst tensors (JAX is the reference)",
                    ["tensor", "kind", "max abs", "max rel", "of tolerance", "within"],
                    [[w["name"], w["kind"], _fmt(w["abs"], ".3e"), _fmt(w["rel"], ".3e"),
                      _fmt(w["tolerance_used"], ".1%"), "yes" if w["within"] else "NO"] for w in p["worst"]]))
    tol = report["tolerances"]
    out.append((f"Tolerances ({report['dtype']}, profile {report['tolerance_profile']}): "
                "|a-b| <= atol + rtol*max|ref|", ["kind", "atol", "rtol"],
                [[k, _fmt(v["atol"], ".0e"), _fmt(v["rtol"], ".0e")] for k, v in tol.items()]))
    comp = lambda n, k: _fmt((b[n].get("compiles") or {}).get(k))  # noqa: E731
    rows_c = [["setup compiles"] + [comp(n, "setup") for n in names],
              ["loop compiles"] + [comp(n, "loop") for n in names],
              ["steady-state recompiles"] + [comp(n, "steady_state") for n in names],
              ["compile time (s)"] + [_fmt((b[n].get("compiles") or {}).get("compile_s"), ".2f") for n in names]]
    out.append(("Compiles", ["", *names], rows + rows_c))
    for n in names:
        for cause in (b[n].get("compiles") or {}).get("causes", []):
            out.append((f"{n}: recompile at step {cause['step']}", ["cause"], [[cause["cause"][:400]]]))
    sm = lambda n, k: _fmt((b[n].get("step_ms") or {}).get(k), ".3f")  # noqa: E731
    tp = lambda n, k: _fmt((b[n].get("throughput") or {}).get(k), ".4g")  # noqa: E731
    rows_t = [["median step (ms, synced)"] + [sm(n, "median") for n in names],
              ["p10 / p90 (ms)"] + [f"{sm(n, 'p10')} / {sm(n, 'p90')}" for n in names],
              ["tracing median (ms)"] + [_fmt((b[n].get("trace_ms") or {}).get("median"), ".3f") for n in names],
              ["pipelined steps/s"] + [tp(n, "steps_per_s") for n in names],
              ["examples/s"] + [tp(n, "examples_per_s") for n in names],
              ["tokens/s"] + [tp(n, "tokens_per_s") for n in names],
              ["matmul Gflop/step (HLO)"] + [_fmt((b[n].get("flops_per_step") or 0) / 1e9 or None, ".4g")
                                            for n in names],
              ["MFU"] + [_fmt(b[n].get("mfu"), ".2%") for n in names]]
    out.append(("Step time (warm-up steps excluded)", ["", *names], rows_t))
    wall = lambda n, k: _fmt((b[n].get("wall_breakdown") or {}).get(k), ".2f")  # noqa: E731
    rows_w = [["torch_xla trace mode"] + [_fmt(b[n].get("trace_mode")) for n in names],
              ["interpreter start + imports (s)"] + [wall(n, "start_and_imports_s") for n in names],
              ["compile (s)"] + [wall(n, "compile_s") for n in names],
              ["steps, synced + pipelined (s)"] + [wall(n, "steps_s") for n in names],
              ["other: init, parity tensors, HLO, record (s)"] + [wall(n, "other_s") for n in names],
              ["backend process total (s)"] + [wall(n, "total_s") for n in names],
              ["peak host RSS (MiB)"] + [_fmt(b[n].get("peak_rss_mb"), ".0f") for n in names]]
    out.append(("Wall time and memory per backend process", ["", *names], rows_w))
    if report.get("ratios"):
        out.append(("Ratios", ["ratio", "value"], [[k, _fmt(v, ".3f")] for k, v in report["ratios"].items()]))
    return out


def markdown(report: dict) -> str:
    lines = [f"# Parity report: {report['spec_name']}", "",
             f"**Verdict: {report['verdict']}** (status `{report['status']}`, exit code {report['exit_code']})", ""]
    if report.get("message"):
        lines += [report["message"], ""]
    for title, header, rows in tables(report):
        lines += [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
        lines.append("")
    peaks = {n: b.get("peak_source") for n, b in report["backends"].items() if b.get("peak_source")}
    if peaks:
        lines += ["MFU = HLO dot/convolution flops per step / median synced step time / peak: " +
                  "; ".join(f"{n}: {s}" for n, s in peaks.items()), ""]
    plots = report.get("plots") or []
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def print_tables(report: dict, console: Console | None = None) -> None:
    console = console or Console()
    for title, header, rows in tables(report):
        table = Table(title=title, title_justify="left")
        for h in header:
            table.add_column(h)
        for row in rows:
            table.add_row(*[str(c) for c in row])
        console.print(table)
    style = "bold green" if report["verdict"] == "pass" else "bold red"
    console.print(f"verdict: {report['verdict']} ({report['status']})  report: {report['run_dir']}", style=style)
