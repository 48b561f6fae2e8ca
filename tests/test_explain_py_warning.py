"""A Python warning line ('<file>.py:<n>: UserWarning: ...') is no failure, whatever status it names."""
from mgft_doctor.catalog import load_catalog
from mgft_doctor.explain import explain_text

ENTRIES = load_catalog()

WARNED_RUN = """\
/venv/lib/python3.10/site-packages/torch/autograd/graph.py:744: UserWarning: Plan failed with a cudnnException: CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: cudnnFinalize Descriptor Failed cudnn_status: CUDNN_STATUS_NOT_SUPPORTED (Triggered internally at ../aten/src/ATen/native/cudnn/Conv_v8.cpp:919.)
  return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
epoch 1/1: 100%|##########| 500/500 [05:02<00:00,  1.65it/s, loss=0.112]
model saved.
"""


def test_python_warning_naming_a_cudnn_status_is_no_failure():
    report = explain_text(WARNED_RUN, ENTRIES)
    assert not report.failure and not report.diagnoses


def test_real_cudnn_error_after_a_warning_is_still_a_failure():
    report = explain_text(WARNED_RUN + "[rank0]: RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR\n", ENTRIES)
    assert report.failure
    assert report.diagnoses and report.diagnoses[0].code == "MGD443"
