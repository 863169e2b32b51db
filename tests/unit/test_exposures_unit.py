"""Which exposures a request may use (domain/model.py Workspace.valid_exposures), each rule
on its own: the engine also clears the list at a stop (engine/steps.py), so the system tests
alone cannot show that the validity check holds without it."""

from __future__ import annotations

from kibo_ctrl.domain.model import Exposure, ExposureAccess, Resources, Workspace, WorkspaceState

NOW = 1_000_000.0


def _workspace(**fields: object) -> Workspace:
    workspace = Workspace(
        id="ws-00000000000000000001",
        seq=1,
        state=WorkspaceState.AVAILABLE,
        resources=Resources(1, 128, 1),
        bindings=[],
        create_time=NOW,
        update_time=NOW,
        storage_pool="local",
        generation=3,
        data_plane_revision=5,
    )
    for name, value in fields.items():
        setattr(workspace, name, value)
    return workspace


def _exposure(**fields: object) -> Exposure:
    values: dict[str, object] = {
        "id": "ex-1",
        "port": 8000,
        "access": ExposureAccess.TOKEN,
        "generation": 3,
        "revision": 5,
        "create_time": NOW - 10,
        "command_id": "c",
    }
    values.update(fields)
    return Exposure(**values)  # type: ignore[arg-type]


def test_an_exposure_of_this_execution_and_revision_is_valid_while_available() -> None:
    workspace = _workspace(exposures=[_exposure()])
    assert [e.id for e in workspace.valid_exposures(NOW)] == ["ex-1"]


def test_one_of_another_execution_or_revision_is_not() -> None:
    for stale in (_exposure(generation=2), _exposure(revision=4), _exposure(generation=4)):
        assert _workspace(exposures=[stale]).valid_exposures(NOW) == [], stale


def test_none_is_valid_unless_the_workspace_is_available_and_not_being_deleted() -> None:
    for state in WorkspaceState:
        if state is not WorkspaceState.AVAILABLE:
            assert _workspace(state=state, exposures=[_exposure()]).valid_exposures(NOW) == [], state
    assert _workspace(deletion_started=True, exposures=[_exposure()]).valid_exposures(NOW) == []
    assert _workspace(deleted=True, exposures=[_exposure()]).valid_exposures(NOW) == []


def test_an_expired_exposure_is_not() -> None:
    assert _workspace(exposures=[_exposure(expire_time=NOW)]).valid_exposures(NOW) == []
    assert len(_workspace(exposures=[_exposure(expire_time=NOW + 1)]).valid_exposures(NOW)) == 1
