# Source this on the lent GPU machine, from the repository root, after carrying gpu-stage/
# (made by scripts/stage_gpu.sh): it points the loader at the staged Debian libraries, cuDNN and
# NCCL from the machine's pip wheels and the CUDA toolkit, and recreates the absolute paths the
# staged build refers to (the source tree and the build tree).
_root=$PWD
_cudnn=$(python3 -c 'import nvidia.cudnn as m; print(m.__path__[0])' 2>/dev/null)/lib
_nccl=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null)/lib
export LD_LIBRARY_PATH=$_root/gpu-stage/lib:$_cudnn:$_nccl:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LSTM_OPENBLAS=$_root/gpu-stage/lib/libopenblas.so.0
_src=$(cat gpu-stage/source_path 2>/dev/null || echo /work/main)
_bld=$(cat gpu-stage/build_path 2>/dev/null || echo /work/main/build)
if [ "$_src" != "$_root" ]; then mkdir -p "$(dirname "$_src")"; [ -e "$_src" ] || ln -s "$_root" "$_src"; fi
[ -e "$_bld" ] || ln -s "$_root/gpu-stage/build" "$_bld"
[ -e "$_root/build" ] || ln -s "$_root/gpu-stage/build" "$_root/build"
unset _root _cudnn _nccl _src _bld
