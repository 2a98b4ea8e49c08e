# Sourced first in every device call: installs the carried wheels (bench/device_wheels.sh made them; the call
# names ".whl" in carry) into /tmp/site and puts them and the checkout on PYTHONPATH.
#   . bench/device_setup.sh && bash bench/session6.sh 1
command -v python >/dev/null || ln -sf "$(command -v python3)" /usr/local/bin/python
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  2>&1 | grep -v -i "warning" || true
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import hydra, megatron.core, torchtitan, torch; print('device env: torch', torch.__version__, \
'megatron-core', megatron.core.__version__, 'gpu', torch.cuda.get_device_name(0))"
