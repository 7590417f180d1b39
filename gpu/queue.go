package gpu

// Queue is an in-order command queue and the op set. Every op's first
// operand is its destination. Unless an op says otherwise, dst may be the
// same tensor as a source (in place), shapes must match exactly, and
// activations are F32. A shape or dtype mismatch is a programmer error and
// panics; numeric problems never do.
//
// Ops are grouped by what they do; the set is deliberately small and specific
// to omni-pipe's networks.
type Queue interface {
	// Name is the label given at creation.
	Name() string

	// Write copies host values into dst (F32 tensor).
	Write(dst Tensor, src []float32)
	// WriteInt copies host values into dst (I32 tensor).
	WriteInt(dst Tensor, src []int32)
	// Read waits for the queued work and copies src (F32) to the host.
	Read(dst []float32, src Tensor) error
	// ReadInt waits for the queued work and copies src (I32) to the host.
	ReadInt(dst []int32, src Tensor) error
	// Copy copies src to dst (same dtype and shape).
	Copy(dst, src Tensor)
	// Fill sets every element of dst (F32) to v.
	Fill(dst Tensor, v float32)
	// Sync waits until every op submitted so far has finished.
	Sync() error

	// MatMul computes dst[M,N] = x[M,K] · w[N,K]ᵀ (+ bias[1,N] when bias is
	// not nil). w is F32, BF16 or F16 and may be a strided view (an F32
	// activation used as the right operand); x and dst are F32; dst must not
	// alias x or w. Each output row's value is independent of M and of the
	// other rows, bit for bit: a row computed alone or in any batch gives the
	// same floats (streamed decoding and batched sessions rely on it).
	MatMul(dst, x, w, bias Tensor)

	// Add sets dst = a + b.
	Add(dst, a, b Tensor)
	// Mul sets dst = a ⊙ b.
	Mul(dst, a, b Tensor)
	// AddRow sets dst[r] = a[r] + v[0] for every row (v is [1, Cols], any
	// float dtype).
	AddRow(dst, a, v Tensor)
	// MulRow sets dst[r] = a[r] ⊙ v[0] for every row (v is [1, Cols], any
	// float dtype).
	MulRow(dst, a, v Tensor)
	// Scale sets dst = a · s.
	Scale(dst, a Tensor, s float32)
	// RoundBF16 rounds every element of dst to the nearest bfloat16 (ties to
	// even), keeping it in F32: the rounding a bf16 reference applies when it
	// stores an activation.
	RoundBF16(dst Tensor)

	// Act applies an elementwise activation: dst = f(a).
	Act(dst, a Tensor, f Activation)
	// GLU sets dst[r] = a[r][:n] ⊙ sigmoid(a[r][n:]) where a has 2n columns
	// and dst n.
	GLU(dst, a Tensor)

	// RMSNorm sets dst[r] = a[r] / sqrt(mean(a[r]²) + eps), without a weight
	// (multiply by one with MulRow).
	RMSNorm(dst, a Tensor, eps float32)
	// LayerNorm sets dst[r] = (a[r] − mean) / sqrt(var + eps) · w + b (w, b
	// are [1, Cols]; b may be nil).
	LayerNorm(dst, a, w, b Tensor, eps float32)
	// Softmax normalises every row of dst in place.
	Softmax(dst Tensor)

	// RoPE rotates dst in place: row r holds heads of size p.HeadDim at
	// position p.Pos[r].
	RoPE(dst Tensor, p RoPEParams)

	// Attention computes scaled dot-product attention of the rows of q
	// against keys k and values v (one row per key position, heads packed in
	// columns), or against the keys a block table names in pools k and v
	// (AttnParams.Blocks). Query row i sits at position p.QPos0+i and key
	// row j at j; only visible keys (j ≤ position when causal, and within
	// the window) are read, so masked rows may hold anything, even NaN.
	Attention(dst, q, k, v Tensor, p AttnParams)

	// ShortConv is LFM2's depthwise causal convolution along rows with a
	// carried state: with x′ = [state; x] (state holds the previous L−1 input
	// rows), dst[t,c] = Σ_k w[c,k]·x′[t+k,c] for a [C, L] weight. Afterwards
	// state holds the last L−1 rows of x′. dst must not alias x.
	ShortConv(dst, x, w, state Tensor)

	// Embed gathers rows: dst[r] = table[ids[r]]. For len(ids) = Rows·n with
	// n > 1 it sums n rows per output row: dst[r] = Σ_i table[ids[r·n+i]].
	Embed(dst, table Tensor, ids []int32)
	// EmbedIDs is Embed with ids in device memory: ids is an I32 [Rows, n]
	// tensor (a strided view is fine), e.g. the picks of Sample, so that a
	// sampled id feeds the next step without a trip to the host. An id
	// outside the table makes its output row NaN on devices that cannot
	// report it (the CPU panics).
	EmbedIDs(dst, table, ids Tensor)

	// Sample picks one entry of every row of logits (F32 [B, V]) into ids
	// (I32 [B, 1], may be a strided view), row r following rows[r] (len B):
	// exactly SampleHost, bit for bit, on every backend.
	Sample(ids, logits Tensor, rows []SampleRow)

	// Conv1D is a 1-D convolution over time-major input x [Tin, Cin] with a
	// PyTorch Conv1d weight w [Cout, Cin/groups·K] (that is [Cout, Cin/groups,
	// K] flattened) and optional bias [1, Cout]: dst[t,o] = b[o] +
	// Σ_{c,k} w[o,c,k]·x[t·stride + k·dilation − p.PadLeft, g(o)·Cin/groups+c],
	// where positions outside x read zero.
	// dst is [Tout, Cout]; the caller chooses Tout. dst must not alias x.
	Conv1D(dst, x, w, bias Tensor, p ConvParams)
	// ConvTranspose1D is a transposed 1-D convolution (PyTorch
	// ConvTranspose1d weight [Cin, Cout/groups·K]) over x [Tin, Cin]:
	// out[t·stride + k, o] += x[t, c]·w[c, o, k], plus bias, for the full
	// output of (Tin−1)·stride + K rows; dst receives rows
	// [p.PadLeft, p.PadLeft+dst.Rows) of it. dst must not alias x.
	ConvTranspose1D(dst, x, w, bias Tensor, p ConvParams)
	// Conv2D is a 2-D convolution over x laid out [H, Cin·W] (rows are the
	// first spatial axis, time; within a row channel c's W values are
	// contiguous at c·W) with a PyTorch Conv2d weight [Cout, Cin/groups·KH·KW]
	// and optional bias [1, Cout]. dst is [Hout, Cout·Wout] in the same
	// layout; positions outside x read zero.
	Conv2D(dst, x, w, bias Tensor, p Conv2DParams)

	// Transpose sets dst[c, r] = src[r, c] (F32; dst is [src.Cols,
	// src.Rows]). Either may be a strided view; dst must not alias src.
	Transpose(dst, src Tensor)
}

// Activation selects an elementwise function.
type Activation uint8

// Activations.
const (
	SiLU    Activation = iota + 1 // x·sigmoid(x)
	GELU                          // exact: x·Φ(x) with erf
	ReLU                          // max(x, 0)
	ELU                           // x if x > 0 else exp(x) − 1 (alpha 1)
	Sigmoid                       // 1/(1+exp(−x))
)

func (a Activation) String() string {
	switch a {
	case SiLU:
		return "silu"
	case GELU:
		return "gelu"
	case ReLU:
		return "relu"
	case ELU:
		return "elu"
	case Sigmoid:
		return "sigmoid"
	}
	return "activation?"
}

// RoPEStyle selects how a head's dimensions are paired for rotation.
type RoPEStyle uint8

// RoPE styles.
const (
	// RotateHalf pairs dimension j with j+D/2 (NeoX, HF rotate_half).
	RotateHalf RoPEStyle = iota + 1
	// Interleaved pairs dimensions 2j and 2j+1 (GPT-J, complex form).
	Interleaved
)

// RoPEParams configures RoPE.
type RoPEParams struct {
	Style   RoPEStyle
	HeadDim int
	// InvFreq holds the HeadDim/2 inverse frequencies: pair j rotates by
	// Pos[r]·InvFreq[j].
	InvFreq []float32
	// Pos holds the position of every row.
	Pos []int32
	// BF16 reproduces a bf16 reference that rounds cos and sin, each product
	// and the sum to bfloat16 (HF apply_rotary_pos_emb on bf16 tensors).
	BF16 bool
}

// AttnParams configures Attention.
type AttnParams struct {
	Heads, KVHeads, HeadDim int
	// Scale multiplies q·k (usually 1/sqrt(HeadDim)).
	Scale float32
	// QPos0 is the position of q's first row; key row j has position j.
	QPos0 int
	// Causal hides keys after the query's position.
	Causal bool
	// Window, when > 0, also hides keys at or before position−Window
	// (query i sees keys j with i−Window < j ≤ i).
	Window int
	// ProbBF16 reproduces the reference's flash-attention kernels (cuDNN's
	// fused flash for the backbone, FlashAttention-2 for the depthformer):
	// with m the row's maximum scaled score over the visible keys, the
	// unnormalised probabilities p_j = exp(s_j − m) are rounded to bfloat16
	// before the product with V, while the row sum l = Σ p_j is taken from
	// the unrounded fp32 values; out = (Σ bf16(p_j)·v_j) / l. When false
	// the probabilities stay fp32 (out = Σ p_j·v_j / l).
	ProbBF16 bool

	// Blocks, when not nil, pages the keys (vLLM's PagedAttention): k and v
	// are then pools of blocks of BlockRows rows each (a pool's rows are a
	// whole number of blocks), and the keys are the first Keys rows of the
	// sequence that the block table Blocks lists, logical block b being
	// pool block Blocks[b]: key row j (position j) is pool row
	// Blocks[j/BlockRows]·BlockRows + j%BlockRows. Blocks is an I32 [1, n]
	// tensor in device memory with n·BlockRows ≥ Keys (a replayed GPU graph
	// reads the table where it lies, so appending a block rewrites the
	// table, not the op's arguments); only the entries of blocks holding
	// visible keys are read, and each must name a block of the pool. The
	// results are those of contiguous keys holding the same rows, bit for
	// bit. With Blocks nil, k and v hold the keys themselves (k.Rows of
	// them) and BlockRows and Keys are ignored.
	Blocks    Tensor
	BlockRows int
	Keys      int
}

// Conv2DParams configures Conv2D. H and W name the two spatial axes of x
// ([H, Cin·W]); the output sizes come from dst.
type Conv2DParams struct {
	Cin, W, Wout     int
	KH, KW           int
	StrideH, StrideW int
	PadH, PadW       int // zero rows/columns added before the input
	Groups           int
}

// ConvParams configures Conv1D and ConvTranspose1D.
type ConvParams struct {
	K, Stride, Dilation, Groups int
	// PadLeft is the number of virtual rows before x (Conv1D), or the number
	// of leading output rows skipped (ConvTranspose1D).
	PadLeft int
}
