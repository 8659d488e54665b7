"""Image projection for the text service: a cohort of images through the deployment's image component.

Each image is fitted to the encoder's geometry by the `fit` stage (its own call: images
differ in size), then every image of the cohort that the policy gave the same stage is
projected in one call of that stage (`pixels: u8[B, S, S, C] -> embeds: f32[B * n, dim]`).
The stages run on the `image` component's params, acquired for the cohort (loading them if
they were deactivated) and released after it. An image's rows depend only on its own pixels
(the numerical contract of docs/language.md section 9), so who else is in a cohort, or who
left it, never changes them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from loomrt.errors import LoomError, internal_error, run_errors
from loomrt.image_input import FIT_STAGE, ImageInput, ImageSlot

log = logging.getLogger("loomrt.services")


class ImageProjector:
    def __init__(self, model: str, residency: Any, component: Any, images: ImageInput):
        self.model = model
        self.residency = residency
        self.component = component
        self.images = images

    def project(self, slots: list[ImageSlot], executables: Any) -> dict[ImageSlot, LoomError]:
        """Project `slots` with the stages of `executables` (the service's current variant),
        setting each one's `embeds`; the slots that failed, with their error."""
        failed: dict[ImageSlot, LoomError] = {}
        if not slots:
            return failed
        try:
            params = self.residency.acquire(self.component)
        except LoomError as exc:
            return {slot: exc for slot in slots}
        try:
            fitted: dict[str, list[tuple[ImageSlot, np.ndarray]]] = {}
            for slot in slots:
                try:
                    rgb = slot.rgb if slot.rgb is not None else self.images.decode(slot)
                    pixels = _host(self._run(executables, FIT_STAGE, params, {"image": rgb})["pixels"])
                    fitted.setdefault(slot.stage, []).append((slot, pixels))
                except LoomError as exc:
                    failed[slot] = exc
                slot.rgb = None
            for stage, group in fitted.items():
                try:
                    embeds = _host(self._run(executables, stage, params, {"pixels": np.stack([p for _, p in group])})["embeds"])
                except LoomError as exc:
                    failed.update((slot, exc) for slot, _ in group)
                    continue
                rows = embeds.reshape(len(group), -1, embeds.shape[-1])
                for (slot, _), own in zip(group, rows):
                    if own.shape[0] != slot.positions:
                        failed[slot] = LoomError(f"image stage '{stage}' gave {own.shape[0]} rows per image, but the "
                                                 f"policy placed {slot.positions} positions for it")
                        continue
                    slot.embeds, slot.projected = own, True
        finally:
            self.residency.release(self.component)
        return failed

    def _run(self, executables: Any, stage: str, params: Any, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        try:
            with run_errors():
                return executables.programs[stage].run(params, {}, inputs)
        except LoomError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug below us: report it, keep serving
            raise internal_error(log, f"model '{self.model}': image stage '{stage}' failed", exc) from exc


def _host(array: Any) -> np.ndarray:
    """A stage result in host memory (a CUDA program's results are device arrays). The rows go
    back to the device with the step's other inputs; keeping them resident there until the
    prefill is a later optimisation."""
    return array if isinstance(array, np.ndarray) else np.asarray(array.get())


__all__ = ["ImageProjector"]
