"""The accelerator table as the one source of peak FLOP/s (chinchax.cost.hardware).

Independent truth: NVIDIA's and Google's data sheets, and the per-device-kind
peaks chinchax.train used before the table was its source (hand-listed here).
"""

import pytest

from chinchax.cost import hardware as hw

# The trainer's former table: (device-kind substring, dense bf16 FLOP/s per device), matched in
# this order, first hit wins.
OLD_TRAIN_TABLE = (
    ("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
    ("L40S", 362e12), ("L4", 121e12),
    ("TPU v6", 918e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12),
    ("TPU v4", 275e12),
)

# JAX device kinds (jax.devices()[0].device_kind) of the chips above.
DEVICE_KINDS = (
    "NVIDIA H200", "NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB",
    "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA L40S", "NVIDIA L4",
    "TPU v6 lite", "TPU v5p", "TPU v5 lite", "TPU v5e", "TPU v4",
)


def _old_train_peak(kind):
  for key, peak in OLD_TRAIN_TABLE:
    if key.lower() in kind.lower():
      return peak
  return None


def test_h100_pcie_is_not_an_h100_sxm():
  # NVIDIA H100 data sheet: 756 TFLOP/s bf16 dense (PCIe), 989 TFLOP/s (SXM5).
  peak, source = hw.device_peak_flops("NVIDIA H100 PCIe", "gpu")
  assert peak == 756e12 and "NVIDIA H100 PCIe" in source
  assert hw.device_peak_flops("NVIDIA H100 80GB HBM3", "gpu")[0] == 989e12
  table = hw.load_accelerators()
  assert hw.match_accelerator("NVIDIA H100 PCIe", "gpu", table).name == "h100-pcie"
  assert hw.match_accelerator("NVIDIA H100 80GB HBM3", "gpu", table).name == "h100"


@pytest.mark.parametrize("kind", DEVICE_KINDS)
def test_every_old_train_entry_matches_the_table(kind):
  want = _old_train_peak(kind)
  assert want is not None, kind
  peak, source = hw.device_peak_flops(kind, "gpu" if kind.startswith("NVIDIA") else "tpu")
  assert peak == want
  assert source == f"data sheet ({kind}, {want:.3g} FLOP/s per device)"


def test_unknown_device_and_cpu_have_no_peak():
  assert hw.device_peak_flops("Some Future Chip", "gpu") is None
  assert hw.device_peak_flops("cpu", "cpu") is None  # the table's CPU entry is nominal


def test_new_entries_parse_as_hardware_specs():
  assert hw.parse_hardware("h100-pcie").accelerator.peak_flops == 756e12
  h = hw.parse_hardware("l40sx4")
  assert (h.accelerator.name, h.n_devices, h.price_per_hour) == ("l40s", 4, None)
  assert hw.parse_hardware("8xl4").peak_flops == 8 * 121e12
  assert hw.parse_hardware("tpu-v6-lite-8").n_devices == 8
