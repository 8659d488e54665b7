"""loomrt.errors: the one hierarchy; every class renders the same JSON shape with its own status and code."""

import pytest

from loomc.run import errors as run
from loomrt import errors


@pytest.mark.parametrize("cls,status,code", [
    (errors.InvalidRequest, 400, "invalid_request"),
    (errors.NotFound, 404, "not_found"),
    (errors.LocatorNotFound, 404, "locator_not_found"),
    (errors.Conflict, 409, "conflict"),
    (errors.CheckpointError, 500, "checkpoint_error"),
    (errors.PrepareError, 500, "prepare_error"),
    (errors.DispatchError, 500, "dispatch_error"),
    (errors.StageInputError, 500, "stage_input_error"),
    (errors.BindingError, 500, "binding_error"),
    (errors.KernelArgumentError, 500, "kernel_argument_error"),
])
def test_status_type_and_code(cls, status, code):
    err = cls("what went wrong", param="field")
    assert isinstance(err, errors.LoomError)
    assert (err.status, err.code) == (status, code)
    assert err.to_dict() == {"error": {"message": "what went wrong", "type": errors.type_for_status(status),
                                       "param": "field", "code": code}}


def test_dispatch_errors_are_still_value_errors():
    assert issubclass(errors.KernelArgumentError, ValueError)


@pytest.mark.parametrize("raised, cls, status, code", [
    (run.StageInputError("x"), errors.StageInputError, 500, "stage_input_error"),
    (run.BindingError("x"), errors.BindingError, 500, "binding_error"),
    (run.KernelArgumentError("x"), errors.KernelArgumentError, 500, "kernel_argument_error"),
    (run.DispatchError("x"), errors.DispatchError, 500, "dispatch_error"),
    (run.VmRuntimeError("x"), errors.VmRuntimeError, 500, "control_runtime_error"),
    (run.VmMemoryExceeded("x"), errors.VmMemoryExceeded, 500, "control_memory_exceeded"),
    (run.VmBudgetExceeded("x"), errors.VmBudgetExceeded, 500, "control_budget_exceeded"),
    (run.VmExpectFailed("x"), errors.VmExpectFailed, 500, "control_expect_failed"),
    (run.TargetNotBuilt("x"), errors.NotImplementedFeature, 501, "not_implemented"),
])
def test_executor_errors_map_to_their_runtime_kind(raised, cls, status, code):
    """loomc.run raises errors without HTTP meaning; run_errors() is where they get it."""
    with pytest.raises(errors.LoomError) as caught, errors.run_errors():
        raise raised
    err = caught.value
    assert type(err) is cls and (err.status, err.code, err.message) == (status, code, "x")
    assert err.__cause__ is raised


def test_policy_failures_keep_the_policy_status_and_position():
    failure = run.PolicyFailure(422, "bad temperature", param="temperature")
    failure.path, failure.line, failure.column = "p.loom", 3, 9
    err = errors.from_run_error(failure)
    assert isinstance(err, errors.PolicyFailure)
    assert (err.status, err.type, err.code, err.param) == (422, "invalid_request_error", "policy_failure", "temperature")
    assert (err.path, err.line, err.column) == ("p.loom", 3, 9)
    assert err.to_dict() == {"error": {"message": "bad temperature", "type": "invalid_request_error",
                                       "param": "temperature", "code": "policy_failure"}}
    assert errors.from_run_error(run.PolicyFailure(503, "later")).type == "internal_error"
    assert errors.type_for_status(404) == "invalid_request_error" and errors.type_for_status(502) == "internal_error"


def test_control_errors_keep_their_position_and_trace():
    fault = run.VmRuntimeError("cannot index null").locate("p.loom", 2, 14)
    fault.trace = ["p.loom:2:14 in fn inner"]
    err = errors.from_run_error(fault)
    assert str(err) == "p.loom:2:14: cannot index null" and err.trace == fault.trace
    assert (err.path, err.line, err.column, err.status) == ("p.loom", 2, 14, 500)
