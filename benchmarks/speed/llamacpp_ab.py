"""Before/after for an engine change: the engine at REV, the engine here, and ``Llama``, interleaved.

    python benchmarks/speed/llamacpp_ab.py --before REV [--repeat 2] -- [llamacpp_peer.py arm options]

e.g. ``--before 4004b78 --repeat 2 -- --model embedded --threads 1 --ctx 4096 --tokens 64 --prefill 512``.
REV's tree is exported (``git archive``) to a temporary folder with this checkout's
``llamacpp_peer.py`` copied in; each round runs three subprocesses one after the other (engine
at REV, engine here, llama-cpp-python's ``Llama``), each ``llamacpp_peer.py --arm``, so the
three see the same load. Prints every arm and the medians as JSON (``--out`` writes it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER = "benchmarks/speed/llamacpp_peer.py"


def export(rev: str, into: Path) -> None:
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    shutil.copy(ROOT / PEER, into / PEER)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the git revision of the engine before the change")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("peer_args", nargs=argparse.REMAINDER, help="after --: llamacpp_peer.py's arm options")
    args = ap.parse_args()
    extra = [a for a in args.peer_args if a != "--"]
    each: dict[str, list[dict[str, float]]] = {}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp)
        export(args.before, before)
        arms = [("engine_before", before, "engine"), ("engine_after", ROOT, "engine")]
        arms.append(("llama", ROOT, "llama"))
        for r in range(args.repeat):
            for label, root, arm in arms:
                cmd = [sys.executable, str(root / PEER), "--arm", arm, *extra]
                env = {**os.environ, "PYTHONPATH": str(root)}
                done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
                if done.returncode != 0:
                    sys.exit(f"{label} failed:\n{done.stderr[-3000:]}")
                each.setdefault(label, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
                loads.append(round(os.getloadavg()[0], 1))
                print(r, label, each[label][-1], loads[-1], file=sys.stderr, flush=True)
    medians = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in each.items()}
    doc = {"medians": medians, "each": each, "loads": loads, "args": sys.argv[1:]}
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
