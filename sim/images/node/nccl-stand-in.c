/* SIMULATION: a stand-in for a node's own NCCL library (DGX OS's libnccl2). A simulated
 * node has no GPU and no NCCL; this file lets `nccl.library: host` be shown on the sim: the
 * preflight finds it and reads its version string (the one NCCL compiles into
 * libnccl.so), the containers mount and preload it, and the outputs read from the
 * server's processes that it is the library they loaded. It implements nothing (vLLM on
 * CPU runs torch.distributed over gloo and never calls NCCL). */
const char sparkvllm_sim_nccl_version[] = "NCCL version 2.27.3+cuda12.9 (SIMULATION stand-in)";
