"""The report: the machine line, running every figure, the table with ratios,
the JSON and the PNG chart, and the CLI entry point."""
import json
import os
import platform
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .footprint import footprint
from .footprint import rows as footprint_rows
from .instructions import instructions
from .recovery import kill_to_recovery
from .starvation import writer_starvation
from .throughput import read_throughput
from .uncontended import uncontended
from .wake import pause_to_wake

# ==================================================================== report

def machine() -> str:
    """One line naming the machine the figures were measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{platform.machine()} {model or platform.processor()}, {os.cpu_count()} CPUs, "
            f"Linux {platform.release()}, Python {platform.python_version()}")


def run(quick: bool = False, out: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run every section; return the results (also printed as they come)."""
    if quick:
        procs, seconds, starve_s, counts, rounds, rec_rounds = [1, 2, 4], 0.3, 1.0, [1, 4, 16], 7, 5
    else:
        procs, seconds, starve_s, counts, rounds, rec_rounds = [1, 2, 4, 8], 1.0, 2.0, \
            [1, 4, 16, 64], 25, 15
    res: Dict[str, Any] = {"machine": machine(), "quick": quick,
                           "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    out(f"pyshmlock bench{' --quick' if quick else ''} on {res['machine']}")
    out("  uncontended calls ...")
    res["uncontended"] = uncontended(*((7, 20000) if quick else (25, 100000)))
    out("  instructions per call (callgrind) ...")
    res["instructions"] = instructions(1000 if quick else 4000)
    out("  read throughput ...")
    res["read_throughput"] = read_throughput(procs, seconds)
    out(f"  writer starvation ({starve_s:.0f} s per lock) ...")
    res["writer_starvation"] = writer_starvation(starve_s)
    out("  pause-to-wake ...")
    res["pause_to_wake"] = pause_to_wake(counts, rounds)
    out("  kill-to-recovery ...")
    res["kill_to_recovery"] = kill_to_recovery(rec_rounds)
    out("  process footprint after many opens ...")
    res["footprint"] = footprint(*((200, 5_000, 0.5) if quick else (200, 200_000, 2.0)))
    return res


def format_report(res: Dict[str, Any], width: Optional[int] = None) -> str:
    """The results as one table: section, case, figure, ratio to pyshmlock."""
    rows: List[Tuple[str, str, str, str]] = []
    for key, r in res.get("uncontended", {}).items():
        if "error" in r:
            rows.append(("uncontended calls", key, r["error"], ""))
            continue
        ratio = f"{r['vs_posix_ipc']:.2f}x posix_ipc pair" if r.get("vs_posix_ipc") else "-"
        if key.startswith("pyshmlock") and r.get("vs_multiprocessing_lock"):
            ratio = f"{r['vs_multiprocessing_lock']:.2f}x multiprocessing.Lock pair, {ratio}"
        if r.get("vs_asyncio_lock"):
            ratio = f"{r['vs_asyncio_lock']:.2f}x asyncio.Lock on its loop"
        rows.append(("uncontended calls", key, f"median {r['median_ns']:.0f} ns", ratio))
    ins = res.get("instructions", {})
    if "error" in ins:
        rows.append(("instructions per call", "every case", ins["error"], ""))
    for key, r in ins.items():
        if key == "error":
            continue
        ratio = (f"{r['vs_multiprocessing_lock']:.2f}x multiprocessing.Lock pair"
                 if r.get("vs_multiprocessing_lock") else "-")
        rows.append(("instructions per call", key, f"{r['instructions']:.0f} instructions",
                     ratio))
    rt = res.get("read_throughput", {})
    for key, r in rt.items():
        base = rt.get(f"pyshmlock x{r['processes']}", {}).get("pairs_per_s")
        ratio = f"{base / r['pairs_per_s']:.2f}x" if base else "-"
        rows.append(("read throughput", key, f"{r['pairs_per_s'] / 1e6:.2f} M pairs/s",
                     f"pyshmlock {ratio}"))
    ws = res.get("writer_starvation", {})
    for key, r in ws.items():
        if "error" in r and "writer_acquisitions" not in r:
            rows.append(("writer starvation", key, r["error"], ""))
            continue
        fig = (f"{r['writer_acquisitions']} writer entries, wait median "
               f"{(r.get('median_wait_ms') or 0):.2f} ms, max {(r.get('max_wait_ms') or 0):.1f} ms")
        rows.append(("writer starvation", key, fig, ""))
    pw = res.get("pause_to_wake", {})
    for key, r in pw.items():
        if "error" in r:
            rows.append(("pause-to-wake", key, r["error"], ""))
            continue
        base = pw.get(f"pyshmlock resume() x{r['processes']}", {}).get("median_us")
        ratio = f"{r['median_us'] / base:.2f}x pyshmlock" if base else "-"
        rows.append(("pause-to-wake", key, f"median {r['median_us']:.0f} us, "
                     f"p99 {r['p99_us']:.0f} us", ratio))
    kr = res.get("kill_to_recovery", {})
    base = kr.get("pyshmlock dead writer", {}).get("median_us")
    for key, r in kr.items():
        if "error" in r:
            rows.append(("kill-to-recovery", key, r["error"], ""))
            continue
        ratio = f"{r['median_us'] / base:.1f}x pyshmlock writer" if base else "-"
        rows.append(("kill-to-recovery", key, f"median {r['median_us']:.0f} us, "
                     f"max {r['max_us']:.0f} us", ratio))
    rows.extend(footprint_rows(res.get("footprint", {})))
    from pyshmlock._table import format_table
    head = ("section", "case", "figure", "ratio")
    grouped, last = [], None
    for r in rows:
        grouped.append((r[0] if r[0] != last else "",) + tuple(r[1:]))
        last = r[0]
    return format_table(head, grouped, width)


#: The chart is drawn to be read at a documentation page's width (about
#: 950 px on the site, 1280 px windows): one panel per row, 11 pt text at
#: 150 dpi, so that the labels are about 15 px tall on the page; the page
#: links the image at full size.
CHART_DPI = 150
CHART_FONT_PT = 11


def save_chart(res: Dict[str, Any], path: str) -> bool:
    """A PNG of the pause-to-wake, writer-starvation and recovery figures
    (needs matplotlib), one panel above the other."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    with plt.rc_context({"font.size": CHART_FONT_PT}):
        fig, axes = plt.subplots(3, 1, figsize=(9, 12),
                                 gridspec_kw={"height_ratios": [1.3, 1, 1]})
        pw = {k: v for k, v in res.get("pause_to_wake", {}).items() if "median_us" in v}
        labels = sorted({v["primitive"] for v in pw.values()})
        counts = sorted({v["processes"] for v in pw.values()})
        for lab in labels:
            ys = [pw.get(f"{lab} x{n}", {}).get("median_us") for n in counts]
            axes[0].plot(counts, ys, marker="o", label=lab)
        axes[0].set(title="pause-to-wake: the last of N blocked processes (median)",
                    xlabel="blocked processes", ylabel="µs", xscale="log", yscale="log")
        axes[0].set_xticks(counts, [str(n) for n in counts])
        axes[0].grid(True, which="major", alpha=0.3)
        axes[0].legend(loc="upper left")
        ws = {k: v for k, v in res.get("writer_starvation", {}).items()
              if "writer_acquisitions" in v}
        bars = axes[1].barh(list(ws), [v["writer_acquisitions"] for v in ws.values()])
        axes[1].bar_label(bars, padding=3)
        axes[1].set(title="writer entries beside overlapping readers (more is better)",
                    xlabel="acquisitions")
        axes[1].margins(x=0.12)
        kr = {k: v for k, v in res.get("kill_to_recovery", {}).items() if "median_us" in v}
        bars = axes[2].barh(list(kr), [v["median_us"] / 1000 for v in kr.values()])
        axes[2].bar_label(bars, fmt="%.2f ms", padding=3)
        axes[2].set(title="kill-to-recovery (median, less is better)", xlabel="ms",
                    xscale="log")
        if kr:     # room for the longest bar's label (a log axis ignores margins)
            axes[2].set_xlim(right=max(v["median_us"] for v in kr.values()) / 1000 * 6)
        fig.suptitle(res.get("machine", ""))
        fig.tight_layout()
        fig.savefig(path, dpi=CHART_DPI)
        plt.close(fig)
    return True


def main(quick: bool, json_path: Optional[str], png_path: Optional[str],
         out: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run, print the table, write JSON (and PNG when asked and possible)."""
    res = run(quick, out)
    out("")
    out(format_report(res))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=2)
        out(f"\nresults written to {json_path}")
    if png_path:
        if save_chart(res, png_path):
            out(f"chart written to {png_path}")
        else:
            out("chart skipped: matplotlib is not installed (pip install 'pyshmlock[bench]')")
    return res
