"""Tiny MOPD probe: how biased and noisy is the sampled reverse-KL advantage against the exact KL?

    python benchmarks/probes/mopd_kl.py STEPS STUDENT TEACHER_GENERAL_TASKS TEACHER_OTHERS TOKENIZER OUT.json

Student = a tiny SFT policy; the general_tasks routes go to one teacher checkpoint, the other six
routes to another. Per step: the exact KL, k1/k3 means, biases and variances, the IS-cap rate;
CPU and wall time. Budgets are cut to 256/384/512 policy tokens per episode to fit a CPU."""
import json, resource, sys, time, envs
from datagen.tokenizer import load_tokenizer
from k3model.train.effort import EffortSpec
from k3model.train.mopd import MOPDConfig, train
def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
steps, student, t_general, t_other, tok_path, out_path = sys.argv[1:7]
steps = int(steps)
tok = load_tokenizer(tok_path)
routes = [(d, e) for d in envs.DOMAINS for e in ("low", "high", "max")]
teachers = {r: (t_general if r[0] == "general_tasks" else t_other) for r in routes}
specs = {"low": EffortSpec(256, 0.2, 128), "high": EffortSpec(384, 0.1, 192), "max": EffortSpec(512, 0.0, 256)}
cfg = MOPDConfig(steps=steps, episodes_per_step=9, log_every=1, specs=specs, lr=5e-5)
c0, t0 = cpu(), time.time()
rows = []
def log(s, m):
    rows.append({k: v for k, v in m.items() if isinstance(v, (int, float))}); print(s, json.dumps({k: round(v, 4) for k, v in m.items() if isinstance(v, float) and k.startswith(("kl/", "train/loss", "rollout/", "mopd/is"))}), flush=True)
import tempfile
res = train(cfg, student, teachers, tok, tempfile.mkdtemp(prefix="mopd_kl_"), log_fn=log)
out = {"cpu_s": cpu() - c0, "wall_s": time.time() - t0, "history": res.history, "metrics": res.metrics, "flops": res.flops,
       "note": "OMP_NUM_THREADS=1, nice 10, machine loaded by 7 engineers (load avg ~10 on 2 cores)"}
json.dump(out, open(out_path, "w"), indent=1, default=str)
print("cpu", round(out["cpu_s"], 1), "wall", round(out["wall_s"], 1))
