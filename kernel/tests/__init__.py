"""Tests of lightspeed-kernel (a package so their module names never clash with tests/triton/)."""
