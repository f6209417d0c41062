"""Test tooling shipped with the package: real engines for integration tests, CI and the demo."""
