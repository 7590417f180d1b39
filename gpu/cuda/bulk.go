package cuda

// The few-row products streamed through shared memory (kernels.cu:
// mmvb_run). On sm_90 a one- to eight-row product on a weight's tiled copy
// (tiled.go) runs as a persistent kernel of at most one block a
// multiprocessor: one thread of each block copies the block's weights,
// 32 KiB a round of a tile, with bulk copies into a ring of mmvbStages
// stages, while eight warps multiply from there — the weights of
// mmvbStages rounds in flight a multiprocessor at all times, instead of
// each warp's registers' worth (MMVT). The sums are mmv_tile's, in its
// order: the same bits (TestMmvVariantsBitIdentical,
// TestNormFusedEqualsSeparate).

const (
	// mmvbKernel and mmvnbKernel are the kernels: MMVT's product and
	// MMV_NORM's (the norm into shared memory first).
	mmvbKernel  = "mmvb_bf16"
	mmvnbKernel = "mmvnb_bf16"
	// mmvbStages, mmvbStageBytes, mmvbPartBytes: kernels.cu's MMVB_STAGES,
	// MMVB_STAGE_BYTES (16 superblocks of a tile), MMVB_PART_BYTES (the
	// 16 class sums of a tile, 8 rows of x).
	mmvbStages     = 3
	mmvbStageBytes = 32768
	mmvbPartBytes  = 16 * 32 * 4 * 4
	// mmvbShm is mmvb_bf16's dynamic shared memory, and mmvnb_bf16's
	// before its row (kernels.cu: MMVB_XS_OFF). 112 KiB with a 2,048-wide
	// row: two blocks fit a multiprocessor of an H200 (228 KiB), so the
	// next kernel's block can start its copies while this one ends.
	mmvbShm = mmvbStages*mmvbStageBytes + mmvbPartBytes
	// mmvbMaxShm is the most either takes: mmvnb_bf16's row at
	// mmvNormMaxK (the attribute set at load; a GPU that cannot opt in to
	// it runs the MMVT kernels).
	mmvbMaxShm = mmvbShm + 4*mmvNormMaxK
)

// mmvbBlock is the kernels' block: eight warps multiply, one copies.
var mmvbBlock = [2]uint32{32 * 9, 1}

// mmvbGrid is the grid for M rows of x and N weight rows on sms
// multiprocessors: one block a multiprocessor, at most one a 16-row tile,
// and one such row of blocks a tile of 8 rows of x (the backend's picks
// have one; tests force more).
func mmvbGrid(M, N, sms int) [3]uint32 {
	return [3]uint32{uint32(max(1, min((N+15)/16, sms))), uint32((M + 7) / 8), 1}
}

// mmvbTiles returns the tiles [t0, t1) block b of a grid of g takes of
// T (kernels.cu: mmvb_run).
func mmvbTiles(T, g, b int) (t0, t1 int) {
	return int(int64(T) * int64(b) / int64(g)), int(int64(T) * int64(b+1) / int64(g))
}
