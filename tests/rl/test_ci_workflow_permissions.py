"""CI security: only the deploy job may publish to GitHub Pages.

The build job runs pull-request code, so it must not hold ``pages: write`` or
``id-token: write``; the workflow-level permissions are read-only and the
deploy job asks for the Pages rights itself. (Kept with the trainer tests
because this folder is where the reliability checks of issue 10 live.)
"""

from pathlib import Path

import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "book.yml"
PUBLISHING = {"pages", "id-token"}


def _load() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _writes(permissions: object) -> set[str]:
    if permissions in ("write-all",):
        return set(PUBLISHING) | {"contents"}
    if not isinstance(permissions, dict):
        return set()
    return {name for name, level in permissions.items() if level == "write"}


def test_workflow_level_permissions_are_read_only():
    flow = _load()
    assert "permissions" in flow, "without a permissions block every job gets the default token"
    assert _writes(flow["permissions"]) == set()


def test_only_the_deploy_job_can_publish():
    jobs = _load()["jobs"]
    for name, job in jobs.items():
        granted = _writes(job.get("permissions"))
        if name == "deploy":
            assert PUBLISHING <= granted
            assert "pull_request" not in str(job.get("if", "")), job.get("if")
            assert "push" in str(job.get("if", ""))
        else:
            assert not granted & PUBLISHING, f"job {name!r} can publish: {granted}"
