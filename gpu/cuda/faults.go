package cuda

// Faults maps each planted fault of kernels.cu (compiled in with
// Options.Fault, as -DFAULT_<name>) to the op whose contract check must
// catch it. They are the kernel contract's controls: a check that passes a
// perturbed kernel proves nothing.
var Faults = map[string]string{
	"TRANSPOSE":       "transpose",       // reads the tile one column off
	"BINARY":          "add",             // halves b in the last column
	"ROWOP":           "addrow",          // reads v one column off
	"ROUND":           "roundbf16",       // truncates instead of rounding to nearest even
	"ACT":             "act",             // SiLU with sigmoid(+x) instead of sigmoid(−x)
	"RMSNORM":         "rmsnorm",         // drops eps
	"LAYERNORM":       "layernorm",       // drops the bias
	"SOFTMAX":         "softmax",         // a denominator 1e-4 too large
	"ROPE":            "rope",            // positions off by one
	"EMBED":           "embed",           // sums the second id twice, the first never (embedids too)
	"SAMPLE_TOPK":     "sample",          // keeps the top k+1
	"SAMPLE_PENALTY":  "sample",          // divides negative penalised logits instead of multiplying
	"SAMPLE_EXP":      "sample",          // drops the low part of ln 2 in exp's reduction (one-ulp-scale errors)
	"SAMPLE_SUPPRESS": "sample",          // ignores the suppressed ids
	"SAMPLE_ARGMAX":   "sample",          // the greedy pick's unrolled loop lets the last of equal values win
	"LOGMEL":          "logmel",          // the second STFT frame of a pair gets the first one's spectrum
	"SHORTCONV":       "shortconv",       // zeroes the first output row
	"MATMUL":          "matmul",          // bias index off by one (FMA kernels)
	"PROMPT":          "matmulprompt",    // the prompt product's GEMM reads x one row late (host side: cublas.go)
	"MATMUL_TILED":    "matmul",          // the FMA 64 × 64 tile kernel loses lane 16's partial (terms 128–135 of every 256)
	"EPILOGUE":        "fused",           // a folded Mul adds instead (TestFusedOps, not gputest)
	"GEMV":            "matmul",          // bias index off by one (one-row kernel)
	"MMA":             "matmul",          // swaps the two k halves of x in the tensor-core tile kernel (more rows than the few-row one takes)
	"MMA_BIG":         "matmul",          // the 64 × 64 tile kernel pairs each weight pair with the next k pair of x
	"MMA_FOLD":        "matmul",          // the split tile product's fold drops the last class's sums
	"SPLIT":           "matmul",          // split_bf16's four-float path swaps each pair of x's components
	"MMV":             "matmul",          // drops each warp's first superblock in the few-row tensor-core kernel
	"MMV_GLU":         "normglu",         // the fused SwiGLU kernel takes silu of the up product, not the gate's
	"MMV_PERSIST":     "normglu",         // a fused-norm kernel's block skips its second tile (grids smaller than their tiles)
	"MMV_CARRY":       "normglu",         // a block's next tile starts on the first superblock of the tile after it
	"MMV_EXACT":       "matmul",          // the few-row kernels' bf16 fast path takes fp32 rows as bf16 (drops their low halves)
	"ATTN_MASK":       "attention",       // sliding window one key too wide
	"ATTN_ROUND":      "attention",       // drops the bf16 rounding of exp(s − m)
	"ATTN_VEC":        "attention",       // the vector path of a 64-wide head's scores pairs q with the key's next component
	"PAGED":           "attention",       // ignores the block table (pool rows read as contiguous)
	"CONV1D":          "conv1d",          // input index off by one
	"CONVTR":          "convtranspose1d", // kernel taps reversed
	"CONV2D":          "conv2d",          // first kernel row's column shifted
	"CONV2D_PW":       "conv2d",          // the pointwise kernel drops the last input channel
	"NORMFUSE":        "normmatmul",      // the fused norms drop eps (GEMV_NORM, prep_heads: rms_inv)
	"HEADROPE":        "headnormrope",    // the fused rotation reads the frequencies reversed
	"ATTN_SEQS":       "attentionseqs",   // every row of a batch attends as its first row does
	"SHORTCONV_SEQS":  "shortconvseqs",   // every sequence convolves with the first one's state
	"SHORTCONV_GATE":  "shortconvgated",  // the gated convolution drops the gate's b (convolves x as it is)
	"COPY_ROWS":       "copyrows",        // every row copies the first pair's source row
	"COPY_MANY":       "copymany",        // drops the last row of every copy of several rows
	"RELPOS_SCORES":   "relposscores",    // the rows after the first take rel_shift one column on
	"HEADS_MATMUL":    "headsmatmul",     // every head after the first reads vt one row early
	"STDBLOCK":        "block",           // the fused block's attention leaves out the key and value at Pos
}

// hostFaults are the planted faults of Faults that live in the Go code
// driving a library (cublas.go), not in kernels.cu: their controls run
// the embedded kernels unchanged.
var hostFaults = map[string]bool{"PROMPT": true}

// testFaults are planted faults checked by a test of their own instead of
// the kernel contract (the fault, the test that must catch it).
var testFaults = map[string]string{
	"PDL": "TestProgrammaticLaunchOrders", // no griddepcontrol.wait: a kernel may read its predecessor's output early
}
