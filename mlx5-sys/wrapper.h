/* The two rdma-core headers gdaki binds (build.rs runs bindgen over this file). */
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
