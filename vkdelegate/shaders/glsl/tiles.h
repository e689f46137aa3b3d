// Workgroup tiles of the one-row products (linear_qw_gemv.glsl's DIRECT form,
// gemv.glsl's b [N, K] form): with TILES > 1 a workgroup of TILES * T invocations (T
// the form's own workgroup size) is TILES tiles of T, each computing exactly what one
// workgroup of T computes without it (tile i of workgroup g: workgroup g * TILES + i's
// outputs), so that a product launches 1 / TILES as many workgroups. A tile is whole
// subgroups (T a multiple of every subgroup size of the device: the host checks),
// tile i the subgroups i * SPT .. (i + 1) * SPT - 1, so that nothing assumes a mapping
// of invocations to subgroups; LANE is the invocation's place in its tile, TILE_SG its
// subgroup's. Needs subgroup operations (gl_SubgroupID) where TILES > 1.
// Without TILES (or TILES 1): the whole workgroup is tile 0, LANE the local invocation.
#ifndef TILES
#define TILES 1
#endif
#if TILES > 1
#define SPT (int(gl_NumSubgroups) / TILES)  // subgroups per tile
#define TILE (int(gl_SubgroupID) / SPT)
#define TILE_SG (int(gl_SubgroupID) % SPT)
#define LANE (TILE_SG * int(gl_SubgroupSize) + int(gl_SubgroupInvocationID))
#else
#define TILE 0
#define LANE int(gl_LocalInvocationID.x)
#define SPT int(gl_NumSubgroups)
#define TILE_SG int(gl_SubgroupID)
#endif
