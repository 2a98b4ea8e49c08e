# Sourced on an air-gapped GPU machine, in the checkout that carries .whl/ (launchers/offline_wheels.sh made it):
# installs those wheels into /tmp/site without a registry and puts them and the checkout on PYTHONPATH, then
# prints the versions and the GPU it sees.
#   . launchers/offline_env.sh && python bench/turbo_kernels.py --gpu-time
command -v python >/dev/null || ln -sf "$(command -v python3)" /usr/local/bin/python
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  2>&1 | grep -v -i "warning" || true
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import hydra, megatron.core, torchtitan, torch; print('offline env: torch', torch.__version__, \
'megatron-core', megatron.core.__version__, 'gpu', torch.cuda.get_device_name(0))"
