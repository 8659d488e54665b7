"""loomrt: the Loom runtime (devices, checkpoints, control VM, registrations, services).

Not built yet: see the runtime-core issue. The package exists so the layout and
console scripts are in place from the start.
"""
