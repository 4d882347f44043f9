"""Start-up: the CPU a fresh process spends importing what a TFX iteration needs, with TFX's component package and
TFMA's ``__init__`` deferred (the default) against the same imports with ``SAGE_EAGER_IMPORTS=1``, in the same run.

Each measurement is a fresh Python process that imports ``sage_tfx``, TensorFlow, TFX's local DAG runner, the
Pusher, tf.Transform's Beam implementation and sage's four components, then prints its own CPU time
(``time.process_time``: steadier than wall time on a shared machine). The two variants alternate ``--repeats``
times; the figures are the medians and their ratio (deferred / eager, lower is better). A ``sage run``, each
``sage serve`` worker and each Beam worker process pays this once.
"""

import json
import os
import statistics
import subprocess
import sys

PROBE = """
import time, sys, json
start = time.process_time()
import sage_tfx, tensorflow, tensorflow_transform.beam
import tfx.orchestration.local.local_dag_runner, tfx.components.pusher.component
import sage_tfx.components.block_example_gen, sage_tfx.components.dp_transform
import sage_tfx.components.dp_trainer, sage_tfx.components.dp_model_validator
heavy = {"keras3": "keras.src", "kubernetes": "kubernetes", "tfma": "tensorflow_model_analysis.evaluators",
         "nltk": "nltk", "sklearn": "sklearn"}
print(json.dumps({"cpu": time.process_time() - start, "modules": len(sys.modules),
                  "loads": sorted(k for k, m in heavy.items() if m in sys.modules)}))
"""


def add_arguments(parser):
    parser.add_argument("--repeats", type=int, default=3, help="processes per variant; the median is reported")


def _probe(eager: bool) -> dict:
    env = {**os.environ, "SAGE_EAGER_IMPORTS": "1" if eager else "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args):
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats!r} must be at least 1")
    deferred, eager = [], []
    for i in range(args.repeats):
        deferred.append(_probe(eager=False))
        eager.append(_probe(eager=True))
        print(
            f"  [{i + 1}/{args.repeats}] deferred {deferred[-1]['cpu']:.2f} s CPU, eager {eager[-1]['cpu']:.2f} s",
            flush=True,
        )
    d = statistics.median(p["cpu"] for p in deferred)
    e = statistics.median(p["cpu"] for p in eager)
    return {
        "deferred_cpu_seconds": round(d, 2),
        "eager_cpu_seconds": round(e, 2),
        "ratio": round(d / e, 3),
        "deferred_modules": deferred[0]["modules"],
        "eager_modules": eager[0]["modules"],
        "deferred_cpu_range": [round(min(p["cpu"] for p in deferred), 2), round(max(p["cpu"] for p in deferred), 2)],
        "eager_cpu_range": [round(min(p["cpu"] for p in eager), 2), round(max(p["cpu"] for p in eager), 2)],
        "deferred_loads": deferred[0]["loads"],
        "eager_loads": eager[0]["loads"],
        "repeats": args.repeats,
    }
