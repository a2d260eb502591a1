"""scripts/check-setup.py against trees that use what setup does not install.

Each test copies the repository's scripts (and what the check reads) into a temporary tree,
changes one thing, and runs the check with --no-present: what is used is compared with what
setup.d declares, so the verdict does not depend on what this machine happens to have."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "check-setup.py"


def tree(tmp: Path) -> Path:
    root = tmp / "repo"
    shutil.copytree(REPO / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("Makefile", ".ci/run", ".cargo/config.toml"):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, root / f)
    return root


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), "--repo", str(root), "--no-present"],
                          capture_output=True, text=True, check=False)


def test_the_scripts_as_they_are_pass(tmp_path: Path) -> None:
    r = check(tree(tmp_path))
    assert r.returncode == 0, r.stderr


def test_a_target_no_step_adds_fails(tmp_path: Path) -> None:
    root = tree(tmp_path)
    step = root / "scripts" / "guests.d" / "70-arm.sh"
    step.write_text("#!/usr/bin/env bash\ncargo build --release --target aarch64-unknown-linux-gnu\n")
    r = check(root)
    assert r.returncode == 1
    assert "rust target aarch64-unknown-linux-gnu" in r.stderr
    assert "scripts/guests.d/70-arm.sh:2" in r.stderr


def test_dropping_the_wasm_target_step_fails(tmp_path: Path) -> None:
    # The tree as it was before the wasm step added its target: the JavaScript guest's build
    # names wasm32-wasip1 and nothing adds it.
    root = tree(tmp_path)
    wasm = root / "scripts" / "setup.d" / "30-wasm.sh"
    text = wasm.read_text()
    assert "rustup_target_add wasm32-wasip1" in text
    wasm.write_text(text.replace("rustup_target_add wasm32-wasip1", ""))
    r = check(root)
    assert r.returncode == 1
    assert "rust target wasm32-wasip1" in r.stderr
    assert "scripts/guests.d/30-wasm.sh" in r.stderr


def test_a_program_no_step_installs_fails(tmp_path: Path) -> None:
    root = tree(tmp_path)
    # bubblewrap is on this machine (setup installs it); a tree whose setup no longer names
    # it, while a script still runs bwrap, must fail whatever the machine has.
    base = root / "scripts" / "setup.d" / "10-base.sh"
    base.write_text(base.read_text().replace(" bubblewrap", ""))
    (root / "scripts" / "peer.sh").write_text("#!/usr/bin/env bash\nbwrap --unshare-all true\n")
    r = check(root)
    assert r.returncode == 1
    assert "program `bwrap` (Debian package bubblewrap)" in r.stderr


def test_a_python_module_no_step_installs_fails(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "scripts" / "tests" / "test_extra.py").write_text("import pytest\nimport yaml\n")
    r = check(root)
    assert r.returncode == 1
    assert "Python module `yaml`" in r.stderr
    assert "pytest" not in r.stderr


def test_a_cargo_tool_no_step_installs_fails(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "scripts" / "audit.sh").write_text("#!/usr/bin/env bash\ncargo audit --deny warnings\n")
    r = check(root)
    assert r.returncode == 1
    assert "`cargo audit`" in r.stderr


def test_a_program_built_from_go_modules_is_accounted_for_by_its_go_build(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "scripts" / "node.sh").write_text("#!/usr/bin/env bash\nkubelet --version\ncrictl ps\n")
    assert check(root).returncode == 0, check(root).stderr
    step = root / "scripts" / "setup.d" / "80-k8s.sh"
    text = step.read_text()
    assert "crictl=sigs.k8s.io/cri-tools/cmd/crictl" in text
    step.write_text(text.replace("crictl=sigs.k8s.io/cri-tools/cmd/crictl", ""))
    r = check(root)
    assert r.returncode == 1
    assert "program `crictl`" in r.stderr
    assert "scripts/node.sh:3" in r.stderr
    assert "kubelet" not in r.stderr


def test_cargo_nextest_is_not_one_of_the_machines_tools(tmp_path: Path) -> None:
    # This kind of machine does not come with cargo-nextest (the earlier kind did): a script
    # that uses it must have a step that installs it.
    root = tree(tmp_path)
    (root / "scripts" / "fast-tests.sh").write_text("#!/usr/bin/env bash\ncargo nextest run\n")
    r = check(root)
    assert r.returncode == 1
    assert "`cargo nextest`" in r.stderr


def test_a_partial_setup_checks_only_its_own_steps(tmp_path: Path) -> None:
    root = tree(tmp_path)
    # A step of the wasm part that declares a package no machine has: the base part's check
    # passes (it does not run that step), the wasm part's names the package.
    (root / "scripts" / "setup.d" / "35-extra.sh").write_text(
        "#!/usr/bin/env bash\n# part: wasm\nset -euo pipefail\napt_install cordon-no-such-package\n")
    base = subprocess.run([sys.executable, str(CHECK), "--repo", str(root), "--steps", "10-base,20-host-tuning"],
                          capture_output=True, text=True, check=False)
    assert base.returncode == 0, base.stderr
    wasm = subprocess.run([sys.executable, str(CHECK), "--repo", str(root), "--steps", "10-base,35-extra"],
                          capture_output=True, text=True, check=False)
    assert wasm.returncode == 1
    assert "Debian package cordon-no-such-package (scripts/setup.d/35-extra.sh:4) is not installed" in wasm.stderr


def test_setup_parts_pick_their_steps_and_the_base(tmp_path: Path) -> None:
    script = (f". {REPO}/scripts/lib.sh; "
              "for p in '' base wasm 'gvisor microvm'; do echo \"[$p]\"; "
              f"select_steps {REPO}/scripts/setup.d $p | xargs -n1 basename; done")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    groups: dict[str, list[str]] = {}
    key = ""
    for line in out.splitlines():
        if line.startswith("["):
            key = line.strip("[]")
            groups[key] = []
        else:
            groups[key].append(line.removesuffix(".sh"))
    every = sorted(p.stem for p in (REPO / "scripts" / "setup.d").glob("*.sh"))
    assert groups[""] == every, "no part: every step"
    assert groups["base"] == ["10-base", "20-host-tuning"]
    assert groups["wasm"] == ["10-base", "20-host-tuning", "30-wasm"]
    assert groups["gvisor microvm"] == ["10-base", "20-host-tuning", "50-microvm", "60-gvisor"]
    # Every step names its part, so none falls into `test` by omission.
    for step in (REPO / "scripts" / "setup.d").glob("*.sh"):
        assert "\n# part: " in step.read_text(), f"{step.name} has no `# part:` line"


def test_setup_refuses_an_unknown_part() -> None:
    r = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "kvm"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 2
    assert "no part 'kvm'" in r.stderr


def test_arithmetic_names_are_variables_but_its_substitutions_run(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "scripts" / "count.sh").write_text(
        "#!/usr/bin/env bash\nn=$(( n + 1 ))\nif [ $(( SECONDS - n )) -ge 1 ]; then :; fi\n"
        "m=$(( $(cordon-no-such-tool) + 1 ))\n")
    r = check(root)
    assert r.returncode == 1
    assert "program `cordon-no-such-tool`" in r.stderr
    assert "program `n`" not in r.stderr and "program `SECONDS`" not in r.stderr
