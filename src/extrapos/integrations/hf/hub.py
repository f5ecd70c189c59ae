"""``extrapos export RUN --out DIR --push-to-hub REPO``: the exported folder uploaded to a Hugging Face Hub
model repository through huggingface_hub's ``HfApi``: the repository created if it is missing
(``create_repo(exist_ok=True)``, private with ``--private``), then every file of the folder in one commit
(``upload_folder``). The folder stays where the export wrote it, so a failed push is retried with
``hf upload REPO DIR`` without exporting again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from extrapos.errors import UserError


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise UserError(
            "--push-to-hub needs the huggingface_hub package; pip install 'extrapos[hf]' (or drop the flag "
            "and upload the folder yourself)."
        ) from None
    return huggingface_hub


def check_repo_id(repo_id: str) -> None:
    """A UserError, before anything is exported, when ``repo_id`` is not ``OWNER/NAME``. The owner is
    required (the Hub would take a bare name as the token's user): a push names where it writes."""
    hub = _hub()
    from huggingface_hub.errors import HFValidationError

    form = (
        "write OWNER/NAME: your user or organisation, then the model's name (letters, digits, '-', '_', '.')"
    )
    if repo_id.count("/") != 1:
        raise UserError(f"--push-to-hub {repo_id!r} is not a Hub repository id; {form}.")
    try:
        hub.utils.validate_repo_id(repo_id)
    except HFValidationError as e:
        raise UserError(
            f"--push-to-hub {repo_id!r} is not a Hub repository id ({str(e).splitlines()[0]}); {form}."
        ) from None


def default_message(folder: Path) -> str:
    """``Upload RUN (step N), exported by extrapos V``, from the folder's extrapos.json where it has one."""
    record_file = folder / "extrapos.json"
    if not record_file.is_file():
        return f"Upload {folder.name}, exported by extrapos"
    record = json.loads(record_file.read_text())
    step = f" (step {record['step']})" if record.get("step") is not None else ""
    version = record.get("extrapos_version")
    by = f"extrapos {version}" if version else "extrapos"
    return f"Upload {record.get('run', folder.name)}{step}, exported by {by}"


def push_folder(
    folder: str | Path, repo_id: str, *, private: bool = False, commit_message: str | None = None
) -> str:
    """Upload ``folder`` to the model repository ``repo_id`` (created if missing; ``private`` applies to a
    repository it creates) in one commit; returns the commit's URL. Every refusal of the Hub (no token,
    no write access, no network) is a UserError naming the fix and the folder to upload again."""
    hub = _hub()
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    folder = Path(folder)
    message = commit_message or default_message(folder)
    again = f"the folder is written: upload it with `hf upload {repo_id} {folder}` once that is fixed"
    api = hub.HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id, folder_path=str(folder), repo_type="model", commit_message=message
        )
    except LocalTokenNotFoundError:
        raise UserError(
            f"cannot push to {repo_id}: no Hugging Face token; log in with `hf auth login` or set HF_TOKEN "
            f"({again})."
        ) from None
    except HfHubHTTPError as e:
        raise UserError(
            f"the Hub refused the push to {repo_id} ({str(e).splitlines()[0]}); check that your token may "
            f"write to it ({again})."
        ) from None
    except (ConnectionError, TimeoutError) as e:  # OfflineModeIsEnabled is a ConnectionError
        raise UserError(f"cannot reach the Hub to push to {repo_id} ({e}); {again}.") from None
    return str(getattr(info, "commit_url", None) or f"https://huggingface.co/{repo_id}")
