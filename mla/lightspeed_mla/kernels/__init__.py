"""Triton kernels (import-guarded: on a machine without Triton these modules define nothing)."""
