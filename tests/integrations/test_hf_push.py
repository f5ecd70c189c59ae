"""`extrapos export RUN --out DIR --push-to-hub OWNER/NAME` (issue 46): the folder the export wrote is
uploaded through huggingface_hub's HfApi (create_repo, then upload_folder in one commit). HfApi's two
methods are replaced by stand-ins that record what would be sent: no network, no token."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

hub = pytest.importorskip("huggingface_hub")

from extrapos.cli import main  # noqa: E402
from tests.integrations.hf_helpers import make_run  # noqa: E402


@pytest.fixture
def calls(monkeypatch):
    """HfApi.create_repo and upload_folder record their arguments (and the folder's files as sent)."""
    seen: list = []

    def create_repo(self, repo_id, **kwargs):
        seen.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, **kwargs):
        folder = Path(kwargs["folder_path"])
        sent = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        seen.append(("upload_folder", kwargs["repo_id"], {**kwargs, "files": sent}))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{kwargs['repo_id']}/commit/abc123")

    monkeypatch.setattr(hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(hub.HfApi, "upload_folder", upload_folder)
    return seen


def test_push_uploads_the_exported_folder_in_one_commit(tmp_path, calls, capsys):
    make_run(tmp_path / "cable-run", positions={"name": "cable"})
    out = tmp_path / "hf"
    code = main(
        ["export", str(tmp_path / "cable-run"), "--out", str(out), "--push-to-hub", "me/cable", "--private"]
    )
    assert code == 0
    assert [c[0] for c in calls] == ["create_repo", "upload_folder"]
    (_, repo, created), (_, uploaded_to, upload) = calls
    assert repo == uploaded_to == "me/cable"
    assert created == {"repo_type": "model", "private": True, "exist_ok": True}
    assert Path(upload["folder_path"]) == out and upload["repo_type"] == "model"
    # every file of the folder as the export wrote it: the model, its code, the tokenizer, the card
    on_disk = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert upload["files"] == on_disk
    assert {"config.json", "model.safetensors", "modeling_extrapos.py", "tokenizer.json", "README.md"} <= set(
        on_disk
    )
    step = json.loads((out / "extrapos.json").read_text())["step"]
    assert upload["commit_message"] == f"Upload cable-run (step {step}), exported by extrapos 0.1.0"
    assert f"pushed {out} -> me/cable" in capsys.readouterr().out


def test_push_takes_the_commit_message_and_defaults_to_public(tmp_path, calls, capsys):
    make_run(tmp_path / "run", positions={"name": "alibi"}, flavour="llama")
    args = ["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), "--push-to-hub", "org/alibi"]
    assert main([*args, "--commit-message", "ALiBi, 2 layers"]) == 0
    assert calls[0][2]["private"] is False
    assert calls[1][2]["commit_message"] == "ALiBi, 2 layers"
    printed = capsys.readouterr().out
    assert "pushed" in printed and "https://huggingface.co/org/alibi/commit/abc123" in printed


@pytest.mark.parametrize("repo", ["alone", "a/b/c", "../x", "me/has space", ""])
def test_a_bad_repository_id_is_refused_before_anything_is_written(tmp_path, calls, capsys, repo):
    make_run(tmp_path / "run", positions={"name": "cable"})
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), "--push-to-hub", repo]) == 2
    err = capsys.readouterr().err
    assert "OWNER/NAME" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "hf").exists() and calls == []


def test_push_flags_without_push_to_hub_are_refused(tmp_path, calls, capsys):
    make_run(tmp_path / "run", positions={"name": "cable"})
    for extra in (["--private"], ["--commit-message", "x"]):
        assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), *extra]) == 2
        assert "applies to --push-to-hub only" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists() and calls == []


def test_no_token_names_the_login_and_leaves_the_folder(tmp_path, monkeypatch, capsys):
    from huggingface_hub.errors import LocalTokenNotFoundError

    def no_token(self, repo_id, **kwargs):
        raise LocalTokenNotFoundError("Token is required but no token found.")

    monkeypatch.setattr(hub.HfApi, "create_repo", no_token)
    make_run(tmp_path / "run", positions={"name": "cable"})
    out = tmp_path / "hf"
    assert main(["export", str(tmp_path / "run"), "--out", str(out), "--push-to-hub", "me/cable"]) == 2
    [err] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("extrapos: error:")]
    assert "hf auth login" in err and f"hf upload me/cable {out}" in err
    assert (out / "model.safetensors").is_file()  # exported; only the push failed
