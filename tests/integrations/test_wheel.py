"""The package as pip installs it (issue 46): `pip wheel --no-deps --no-build-isolation .` builds from the
tracked files alone, its metadata is complete (the README as the description, the MIT license and its
file, classifiers, keywords, the two commands), and a fresh virtual environment that installs the wheel
runs `extrapos doctor` from the installed copy, not from this checkout."""

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import extrapos

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the tracked files (what a clone holds; no build/ or egg-info here)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the tracked files are what is packaged)")
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.split(b"\0")
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    for name in filter(None, (os.fsdecode(t) for t in tracked)):
        path = ROOT / name
        if not path.exists() and not path.is_symlink():
            continue  # deleted in the working tree, not yet committed
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            target.symlink_to(os.readlink(path))
        else:
            shutil.copyfile(path, target)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(base / "dist"),
            ".",
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [built] = (base / "dist").glob("extrapos-*.whl")
    return built


def test_the_wheel_carries_complete_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"extrapos-{extrapos.__version__}.dist-info"
        meta = email.message_from_string(z.read(f"{info}/METADATA").decode("utf-8"))
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert meta["Name"] == "extrapos" and meta["Version"] == extrapos.__version__
    assert meta["Summary"] and meta["Requires-Python"] == ">=3.10"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"
    assert f"{info}/licenses/LICENSE" in names
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3" in classifiers and len(classifiers) >= 5
    assert "length extrapolation" in (meta["Keywords"] or "")
    assert "torch>=2.5" in (meta.get_all("Requires-Dist") or [])
    assert "extrapos = extrapos.cli:main" in entry_points
    assert "extrapos-lm-eval = extrapos.integrations.lm_eval:cli" in entry_points
    # the package data and the modules an export copies into a folder
    assert "extrapos/configs/cpu/tiny.toml" in names
    assert "extrapos/integrations/hf_remote/vendor.py" in names
    assert not any(n.startswith(("tests/", "docs/", "benchmarks/")) for n in names)


@pytest.mark.slow  # a virtual environment, an install and doctor's check: about 20 s on two loaded cores
def test_a_fresh_venv_installs_the_wheel_and_runs_doctor(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # torch and the other dependencies from this environment, without a network: a path line in a .pth is
    # added to sys.path without reading that folder's own .pth files, so this checkout's editable
    # install stays out
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [str(python), "-c", "import extrapos; print(extrapos.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the wheel's copy, not this checkout's src/
    doctor = subprocess.run(
        [str(venv / "bin" / "extrapos"), "doctor", "--encodings", "nope", "--no-speed", "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert doctor.returncode == 0, doctor.stdout[-2000:] + doctor.stderr[-2000:]
    assert "every encoding agrees with the reference" in doctor.stdout
