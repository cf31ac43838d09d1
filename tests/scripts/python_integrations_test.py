#!/usr/bin/env python3
"""The liboffload package's training-loop callbacks and its pip install, without a GPU, torch,
transformers or Lightning: stand-in `transformers`, `lightning.pytorch` and `pytorch_lightning`
modules (a callback base class each) and a stand-in model whose parameters give made-up device
addresses. With the shim preloaded, the callbacks' marks reach it (it takes the frozen device
parameters as read-only, and its step detection turns to the marks); without it they are
no-ops. `pip install --no-build-isolation --no-deps --target DIR ./python` installs a copy that
passes the same checks.

    python_integrations_test.py LIBOFFLOAD_SO
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from checks import Checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRAMEWORKS = ("transformers", "lightning", "pytorch_lightning")

# Runs in a child process (the preload is a launch option): argv[1] is a JSON list of the
# frameworks to stand in for; the others are made unimportable, installed or not.
PROBE = r"""
import importlib.abc, json, sys, types

fakes = json.loads(sys.argv[1])
out = {}


class Block(importlib.abc.MetaPathFinder):
    tried = []  # the frameworks' modules that something tried to import

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "lightning", "pytorch_lightning", "torch"):
            Block.tried.append(name)
            if name.split(".")[0] != "torch" and name not in sys.modules:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Block())

import liboffload, liboffload.integrations
out["file"] = liboffload.__file__
out["version"] = liboffload.__version__
out["loaded"] = liboffload.loaded()
out["frameworks_imported"] = sorted(set(Block.tried))


class Base:
    # The frameworks' callback bases: every hook a no-op returning None.
    def __getattr__(self, name):
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)


if "transformers" in fakes:
    sys.modules["transformers"] = types.ModuleType("transformers")
    sys.modules["transformers"].TrainerCallback = type("TrainerCallback", (Base,), {"__module__": "transformers"})
if "lightning" in fakes:
    sys.modules["lightning"] = types.ModuleType("lightning")
    sys.modules["lightning.pytorch"] = types.ModuleType("lightning.pytorch")
    sys.modules["lightning"].pytorch = sys.modules["lightning.pytorch"]
    sys.modules["lightning.pytorch"].Callback = type("Callback", (Base,), {"__module__": "lightning.pytorch"})
if "pytorch_lightning" in fakes:
    sys.modules["pytorch_lightning"] = types.ModuleType("pytorch_lightning")
    sys.modules["pytorch_lightning"].Callback = type("Callback", (Base,), {"__module__": "pytorch_lightning"})


class Param:
    def __init__(self, requires_grad, is_cuda, ptr):
        self.requires_grad, self.is_cuda, self.ptr = requires_grad, is_cuda, ptr
    def data_ptr(self): return self.ptr
    def numel(self): return 1024
    def element_size(self): return 2


class Model:
    # Two frozen device parameters the shim takes; a trainable one, a frozen host one and a
    # frozen one at address 0 (the shim refuses it) that it must not count.
    def parameters(self):
        return iter([Param(True, True, 0x7f0000000000), Param(False, True, 0x7f0000100000),
                     Param(False, False, 0x1000), Param(False, True, 0x7f0000200000),
                     Param(False, True, 0)])


# Every mark goes through the package's functions: record them, then let them reach the shim.
marks = {"step": 0, "frozen": []}
mark_step, mark_frozen = liboffload.mark_step, liboffload.mark_frozen
def counting_step():
    marks["step"] += 1
    return mark_step()
def recording_frozen(model):
    marks["frozen"].append(model)
    return mark_frozen(model)
liboffload.mark_step, liboffload.mark_frozen = counting_step, recording_frozen


def detection():
    return liboffload.stats().get("step_detection")


def run(name, use):
    try:
        mod = __import__("liboffload.integrations." + name, fromlist=["OffloadCallback"])
    except ImportError as e:
        out[name] = {"import_error": str(e), "import_error_name": e.name}
        return
    marks["step"], marks["frozen"] = 0, []
    r = {"detection_before": detection()}
    r.update(use(mod.OffloadCallback()))
    r["detection_after"] = detection()
    r["step_marks"] = marks["step"]
    out[name] = r


def use_hf(cb):
    model = Model()
    args, state, control = object(), object(), object()
    rets = [cb.on_init_end(args, state, control), cb.on_train_begin(args, state, control, model=model)]
    for _ in range(3):
        rets.append(cb.on_substep_end(args, state, control, model=model))
        rets.append(cb.on_step_end(args, state, control, model=model))
    return {"base": type(cb).__mro__[1].__module__, "frozen": cb.frozen,
            "frozen_marked_model": marks["frozen"] == [model], "returned": sorted({repr(x) for x in rets})}


def use_lightning(cb):
    class Trainer:
        global_step = 5  # resumed from a checkpoint
    trainer, module = Trainer(), Model()
    cb.on_train_start(trainer, module)
    # Gradient accumulation over two batches: global_step moves every other batch.
    marked = []
    for i, step in enumerate([5, 6, 6, 7, 7, 8]):
        trainer.global_step = step
        before = marks["step"]
        cb.on_train_batch_end(trainer, module, {"loss": 0.0}, None, i)
        marked.append(marks["step"] - before)
    return {"base": type(cb).__mro__[1].__module__, "frozen": cb.frozen,
            "frozen_marked_model": marks["frozen"] == [module], "marked_batches": marked}


run("hf", use_hf)
run("lightning", use_lightning)
print(json.dumps(out))
"""


def probe(pythonpath, preload, fakes):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = pythonpath
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leaves no __pycache__ in the source tree
    if preload:
        env.update(LD_PRELOAD=preload, OFFLOAD_TELEMETRY="off", OFFLOAD_DAEMON="off")
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(fakes)], env=env, capture_output=True,
                       text=True, timeout=60)
    if p.returncode != 0:
        raise SystemExit(f"the probe failed ({p.returncode}):\n{p.stderr}")
    return json.loads(p.stdout.splitlines()[-1])


def check_callbacks(where, pythonpath, lib, expect):
    """The callbacks with the stand-in frameworks, with the shim preloaded and without."""
    for preload in (lib, None):
        got = probe(pythonpath, preload, ["transformers", "lightning"])
        tag = f"{where}, {'preloaded' if preload else 'no preload'}"
        expect(f"{tag}: the package comes from {pythonpath}: {got['file']}",
               got["file"].startswith(os.path.join(pythonpath, "liboffload") + os.sep))
        expect(f"{tag}: loaded() is {bool(preload)}: {got['loaded']}", got["loaded"] is bool(preload))
        expect(f"{tag}: importing liboffload tries no framework: {got['frameworks_imported']}",
               got["frameworks_imported"] == [])
        hf, pl = got["hf"], got["lightning"]
        expect(f"{tag}: hf imports with transformers: {hf}", "import_error" not in hf)
        expect(f"{tag}: lightning imports with lightning.pytorch: {pl}", "import_error" not in pl)
        if "import_error" in hf or "import_error" in pl:
            continue
        frozen = 2 if preload else 0  # the shim takes the two frozen device parameters
        expect(f"{tag}: hf subclasses transformers.TrainerCallback: {hf}", hf["base"] == "transformers")
        expect(f"{tag}: hf marks the model's frozen parameters once: {hf}",
               hf["frozen_marked_model"] and hf["frozen"] == frozen)
        expect(f"{tag}: hf marks each optimizer step, not substeps: {hf}", hf["step_marks"] == 3)
        expect(f"{tag}: hf's hooks return None (the Trainer keeps its control): {hf}", hf["returned"] == ["None"])
        expect(f"{tag}: lightning subclasses lightning.pytorch.Callback: {pl}", pl["base"] == "lightning.pytorch")
        expect(f"{tag}: lightning marks the module's frozen parameters once: {pl}",
               pl["frozen_marked_model"] and pl["frozen"] == frozen)
        expect(f"{tag}: lightning marks the batches that moved global_step: {pl}",
               pl["marked_batches"] == [0, 1, 0, 1, 0, 1] and pl["step_marks"] == 3)
        if preload:
            expect(f"{tag}: the shim detects steps by itself before the marks: {hf}",
                   hf["detection_before"] == "automatic")
            expect(f"{tag}: the shim takes the marks: {hf} {pl}",
                   hf["detection_after"] == "offload_mark_step" and pl["detection_after"] == "offload_mark_step")
        else:
            expect(f"{tag}: no shim, no stats: {hf}", hf["detection_after"] is None)


def check_missing(pythonpath, lib, expect):
    """Without the frameworks the integration modules refuse to import, naming the package."""
    got = probe(pythonpath, lib, [])
    hf, pl = got["hf"], got["lightning"]
    expect(f"hf without transformers says to install it: {hf}",
           "transformers" in hf.get("import_error", "") and "pip install transformers" in hf["import_error"]
           and hf["import_error_name"] == "transformers")
    expect(f"lightning without lightning names both packages: {pl}",
           "pip install lightning" in pl.get("import_error", "") and "pytorch_lightning" in pl["import_error"]
           and pl["import_error_name"] == "lightning")
    got = probe(pythonpath, lib, ["pytorch_lightning"])
    pl = got["lightning"]
    expect(f"lightning falls back to pytorch_lightning: {pl}",
           "import_error" not in pl and pl["base"] == "pytorch_lightning" and pl["step_marks"] == 3)


def check_pip(lib, expect):
    """pip installs ./python offline into a directory, and the installed copy works."""
    pip = [sys.executable, "-m", "pip"]
    if subprocess.run(pip + ["--version"], capture_output=True).returncode != 0:
        print(f"SKIP pip install: {sys.executable} has no pip (Debian: apt-get install python3-pip)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        # A copy: setuptools writes build/ and *.egg-info/ beside the sources.
        src = shutil.copytree(os.path.join(ROOT, "python"), os.path.join(tmp, "src"),
                              ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        target = os.path.join(tmp, "site")
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PIP_ROOT_USER_ACTION="ignore")
        env.pop("LD_PRELOAD", None)
        p = subprocess.run(pip + ["install", "-q", "--no-build-isolation", "--no-deps", "--target", target, src],
                           env=env, capture_output=True, text=True, timeout=300)
        hint = ""
        if p.returncode != 0 and "bdist_wheel" in p.stdout + p.stderr:
            hint = "(setuptools before 70.1 builds wheels with the wheel package: apt-get install python3-pip)\n"
        expect(f"pip install --no-build-isolation --no-deps --target passes:\n{hint}{p.stdout}{p.stderr}",
               p.returncode == 0)
        if p.returncode != 0:
            return
        infos = [d for d in os.listdir(target) if d.endswith(".dist-info")]
        expect(f"the installed version is the package's fallback, 0+source: {infos}",
               infos == ["liboffload-0+source.dist-info"])
        for f in ("__init__.py", "integrations/__init__.py", "integrations/hf.py", "integrations/lightning.py"):
            expect(f"pip installs liboffload/{f}", os.path.isfile(os.path.join(target, "liboffload", f)))
        expect("pip leaves _build.py.in out",
               not os.path.exists(os.path.join(target, "liboffload", "_build.py.in")))
        check_callbacks("installed", target, lib, expect)


def main():
    lib = os.path.abspath(sys.argv[1])
    checks = Checks()
    expect = checks.expect

    check_callbacks("source tree", os.path.join(ROOT, "python"), lib, expect)
    check_missing(os.path.join(ROOT, "python"), lib, expect)
    check_pip(lib, expect)
    checks.finish("python integrations and pip install")


if __name__ == "__main__":
    main()
