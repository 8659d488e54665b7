"""loomrt.errors: the one hierarchy; every class renders the same JSON shape with its own status and code."""

import pytest

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
