//! tusk-kernels: CUDA C sources (`kernels/*.cu`) and their NVRTC compile cache. The kernels
//! arrive with the GPU mirror issue; this crate holds the folder's place in the workspace and
//! has no code yet.
