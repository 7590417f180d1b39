package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Benchmarks of the decode-critical kernels at the real model's sizes (run
// on the GPU machine: go test -c, then ./cuda.test -test.bench .).

// BenchmarkCopy measures the device-to-device copy rate (bytes read plus
// bytes written), the ceiling the matrix-vector products are held to.
func BenchmarkCopy(b *testing.B) {
	d := openGPU(b)
	const n = 256 << 20 // F32 elements: 1 GiB
	src, dst := d.Alloc(gpu.F32, 1, n), d.Alloc(gpu.F32, 1, n)
	defer d.Free(src)
	defer d.Free(dst)
	q := d.NewQueue("bench")
	c := d.drv
	sp, dp := src.Buf.(*buffer).ptr, dst.Buf.(*buffer).ptr
	qq := q.(*Queue)
	b.SetBytes(2 * 4 * n)
	b.ResetTimer()
	for range b.N {
		d.do(func() error {
			return c.call("cuMemcpyDtoDAsync", c.cuMemcpyDtoDAsync, dp, sp, uintptr(4*n), qq.stream)
		})
	}
	if err := q.Sync(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkMatMul streams bf16 weights of LFM2's FFN shape [8192, 2048]
// (32 MiB each; 16 of them, 512 MiB, so the L2 cache holds none) through
// MatMul with M rows of x; bytes are the weights read.
func BenchmarkMatMul(b *testing.B) {
	d := openGPU(b)
	const N, K, sets = 8192, 2048, 16
	rng := rand.New(rand.NewPCG(3, 4))
	raw := make([]uint16, N*K)
	for i := range raw {
		raw[i] = gpu.F32ToBF16(float32(rng.Float64()*2 - 1))
	}
	bytes := unsafe.Slice((*byte)(unsafe.Pointer(&raw[0])), 2*len(raw))
	ws := make([]gpu.Tensor, sets)
	for i := range ws {
		t, err := d.Load(gpu.BF16, N, K, bytes)
		if err != nil {
			b.Fatal(err)
		}
		ws[i] = t
	}
	defer func() {
		for _, w := range ws {
			d.Free(w)
		}
	}()
	for _, kind := range []string{"mma", "fma"} {
		for _, M := range []int{1, 2, 4, 8, 16, 64, 128} {
			b.Run(fmt.Sprintf("%s/M=%d", kind, M), func(b *testing.B) {
				d.mmaMatMul = kind == "mma"
				defer func() { d.mmaMatMul = false }()
				q := d.NewQueue("bench").(*Queue)
				x, y := d.Alloc(gpu.F32, M, K), d.Alloc(gpu.F32, M, N)
				defer d.Free(x)
				defer d.Free(y)
				xs := make([]float32, M*K)
				for i := range xs {
					xs[i] = float32(rng.Float64()*2 - 1)
				}
				q.Write(x, xs)
				b.SetBytes(int64(sets) * N * K * 2)
				timeProductSets(b, q, x, y, ws)
			})
		}
	}
}

// BenchmarkMatMulTiles times the tensor-core tile kernels on rows of
// exact bf16 values (what bf16 networks multiply: a batched decode step
// and a prefill chunk) against [8192, 2048] weights × 16 sets, each kernel
// forced, split_bf16 included.
func BenchmarkMatMulTiles(b *testing.B) {
	d := openGPU(b)
	d.mmaMatMul = true
	defer func() { d.mmaMatMul = false }()
	const N, K, sets = 8192, 2048, 16
	rng := rand.New(rand.NewPCG(3, 5))
	ws := make([]gpu.Tensor, sets)
	for i := range ws {
		ws[i] = loadNormalBF16(b, d, rng, N, K)
	}
	defer func() {
		for _, w := range ws {
			d.Free(w)
		}
	}()
	kernels := []string{"mma_bf16_m32", "mma_bf16_big"}
	for _, k := range kernels {
		if r, err := d.KernelResources(k); err != nil {
			b.Logf("%s: %v", k, err) // a diagnostic: the timings do not need it
		} else {
			b.Logf("%s: %d registers, %d bytes of local memory a thread, %d bytes of shared memory a block", k, r.Registers, r.LocalBytes, r.SharedBytes)
		}
	}
	for _, kernel := range kernels {
		for _, M := range []int{16, 32, 64, 128, 256, 512, 1024, 4096} {
			b.Run(fmt.Sprintf("%s/M=%d", kernel, M), func(b *testing.B) { timeTileKernel(b, d, rng, kernel, M, ws) })
		}
	}
}

// timeTileKernel times M rows of exact bf16 values against the weight sets
// ws on the tensor-core tile kernel named (mmaLaunch's pick for "").
func timeTileKernel(b *testing.B, d *Device, rng *rand.Rand, kernel string, M int, ws []gpu.Tensor) {
	N, K := ws[0].Rows, ws[0].Cols
	q := d.NewQueue("bench").(*Queue)
	q.tileForce, q.tileKernel = true, kernel
	x, y := d.Alloc(gpu.F32, M, K), d.Alloc(gpu.F32, M, N)
	defer d.Free(x)
	defer d.Free(y)
	xs := normals(rng, M*K)
	for i := range xs {
		xs[i] = gpu.RoundBF16(xs[i])
	}
	q.Write(x, xs)
	timeProductSets(b, q, x, y, ws)
}

// BenchmarkMatMulFewTiles times the tensor-core tile kernels where 64 × 64
// tiles are few (one clip through the encoder: ≈ 60 rows against [512,
// 512] to [2048, 512]; a 32-session step against [2048, 2048]; a 100-row
// prefill), each kernel forced and the default pick ("auto", mmaLaunch),
// on exact-bf16 rows, sets of weights replayed as one graph.
func BenchmarkMatMulFewTiles(b *testing.B) {
	d := openGPU(b)
	d.mmaMatMul = true
	defer func() { d.mmaMatMul = false }()
	rng := rand.New(rand.NewPCG(4, 6))
	for _, sh := range []struct{ M, N, K int }{{62, 512, 512}, {62, 2048, 512}, {62, 512, 2048}, {32, 2048, 2048}, {32, 8192, 2048}, {100, 2048, 2048}, {100, 8192, 2048}} {
		sets := max(2, (64<<20)/(2*sh.N*sh.K))
		ws := make([]gpu.Tensor, sets)
		for i := range ws {
			ws[i] = loadNormalBF16(b, d, rng, sh.N, sh.K)
		}
		for _, kernel := range []string{"auto", "mma_bf16_m32", "mma_bf16_big"} {
			force := kernel
			if force == "auto" {
				force = "" // mmaLaunch's pick
			}
			b.Run(fmt.Sprintf("%dx%dx%d/%s", sh.M, sh.N, sh.K, kernel), func(b *testing.B) { timeTileKernel(b, d, rng, force, sh.M, ws) })
		}
		for _, w := range ws {
			d.Free(w)
		}
	}
}

// BenchmarkMatMulFMATiles times the FMA products a codec's streams make
// (f32 weights and x; Mimi's SEANet convolutions for 16–64 streams: tens of
// thousands of rows, short K) on the warp tiles (matmul_r8_f32) and on the
// 64 × 64 tiles (matmul_t64_f32), which give the same bits.
func BenchmarkMatMulFMATiles(b *testing.B) {
	d := openGPU(b)
	rng := rand.New(rand.NewPCG(7, 9))
	for _, sh := range []struct{ M, N, K int }{{122880, 64, 192}, {30720, 128, 384}, {24576, 256, 768}, {4096, 512, 1536}, {512, 2048, 512}, {245760, 32, 64}} {
		vals := normals(rng, sh.N*sh.K)
		wb := make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(wb[4*i:], math.Float32bits(v))
		}
		w, err := d.Load(gpu.F32, sh.N, sh.K, wb)
		if err != nil {
			b.Fatal(err)
		}
		x, y := d.Alloc(gpu.F32, sh.M, sh.K), d.Alloc(gpu.F32, sh.M, sh.N)
		q := d.NewQueue("bench").(*Queue)
		q.Write(x, normals(rng, sh.M*sh.K))
		for _, tiles := range []int8{-1, 1} {
			name := map[int8]string{-1: "matmul_r8_f32", 1: "matmul_t64_f32"}[tiles]
			b.Run(fmt.Sprintf("%s/M=%d/N=%d/K=%d", name, sh.M, sh.N, sh.K), func(b *testing.B) {
				q.fmaTiles = tiles
				defer func() { q.fmaTiles = 0 }()
				timeProductSets(b, q, x, y, []gpu.Tensor{w})
			})
		}
		d.Free(x)
		d.Free(y)
		d.Free(w)
	}
}

// timeProductSets times y = x·wᵀ for every w of ws an iteration (the sets
// replayed as graphs, one hand-over an iteration) after two warm-up passes
// (the second replays the graphs the first built), and reports TFLOP/s.
func timeProductSets(b *testing.B, q *Queue, x, y gpu.Tensor, ws []gpu.Tensor) {
	b.Helper()
	M, K, N := x.Rows, x.Cols, y.Cols
	for range 2 {
		for _, w := range ws {
			q.MatMul(y, x, w, gpu.Tensor{})
		}
		if err := q.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		for _, w := range ws {
			q.MatMul(y, x, w, gpu.Tensor{})
		}
		q.flush()
	}
	if err := q.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)*float64(len(ws))*2*float64(M)*float64(N)*float64(K)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
}

// BenchmarkKernelChain replays a chain of 256 dependent small kernels of
// one kind (as a decode step is: one row through norms, rotations, copies
// and products) and reports the time per kernel: the per-launch cost a
// graph replay leaves, against which a step's kernel count is weighed.
func BenchmarkKernelChain(b *testing.B) {
	d := openGPU(b)
	const chain = 256
	rng := rand.New(rand.NewPCG(5, 6))
	vals := normals(rng, 2048)
	w := loadNormalBF16(b, d, rng, 1024, 1024)
	defer d.Free(w)
	x, y := d.Alloc(gpu.F32, 1, 2048), d.Alloc(gpu.F32, 1, 2048)
	defer d.Free(x)
	defer d.Free(y)
	inv := make([]float32, 32)
	for i := range inv {
		inv[i] = float32(i+1) / 64
	}
	for _, k := range []struct {
		name string
		op   func(q gpu.Queue)
	}{
		{"copy", func(q gpu.Queue) { q.Copy(y, x) }},
		{"rmsnorm", func(q gpu.Queue) { q.RMSNorm(y, x, 1e-5) }},
		{"rope", func(q gpu.Queue) {
			q.RoPE(y, gpu.RoPEParams{Style: gpu.RotateHalf, HeadDim: 64, InvFreq: inv, Pos: []int32{7}, BF16: true})
		}},
		{"gemv1024", func(q gpu.Queue) { q.MatMul(y.ColSlice(0, 1024), x.ColSlice(0, 1024), w, gpu.Tensor{}) }},
	} {
		b.Run(k.name, func(b *testing.B) {
			q := d.NewQueue("chain")
			q.Write(x, vals)
			for range 3 { // the graph is built on the second sight
				for range chain {
					k.op(q)
				}
				if err := q.Sync(); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				for range chain {
					k.op(q)
				}
				if err := q.Sync(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chain), "ns/kernel")
		})
	}
}

// BenchmarkGemvLarge streams one large bf16 weight per product — the text
// head's [65536, 2048] (256 MiB) and an [8192, 8192] — with one row of x:
// the one-row kernel's own rate, without BenchmarkMatMul's launch gaps
// between sixteen 32 MiB products.
func BenchmarkGemvLarge(b *testing.B) {
	d := openGPU(b)
	for _, sh := range []struct{ N, K int }{{65536, 2048}, {8192, 8192}} {
		b.Run(fmt.Sprintf("%dx%d", sh.N, sh.K), func(b *testing.B) {
			w := loadNormalBF16(b, d, rand.New(rand.NewPCG(7, 8)), sh.N, sh.K)
			defer d.Free(w)
			x, y := d.Alloc(gpu.F32, 1, sh.K), d.Alloc(gpu.F32, 1, sh.N)
			defer d.Free(x)
			defer d.Free(y)
			q := d.NewQueue("gemv")
			q.MatMul(y, x, w, gpu.Tensor{})
			if err := q.Sync(); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(2 * sh.N * sh.K))
			b.ResetTimer()
			for range b.N {
				q.MatMul(y, x, w, gpu.Tensor{})
			}
			if err := q.Sync(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkGemvRows streams the text head's [65536, 2048] bf16 weights
// (256 MiB, beyond L2) with M rows of x through every few-row kernel
// variant, the default pick ("auto") and the tile kernels ("tile"), in
// both orders (FMA; "mma-…" and mmv_…: the tensor cores'): bytes
// are the weights read once, so MB/s against BenchmarkCopy's rate is the
// fraction of the copy bandwidth a batched decode step keeps.
func BenchmarkGemvRows(b *testing.B) {
	d := openGPU(b)
	const N, K = 65536, 2048
	w := loadNormalBF16(b, d, rand.New(rand.NewPCG(11, 12)), N, K)
	defer d.Free(w)
	for _, M := range []int{1, 2, 3, 4, 8, 16, 32} {
		names := []string{"auto", "tile", "mma-auto", "mma-tile"}
		for _, v := range gemvrVariants {
			if v.r <= 2*M && M > 1 {
				names = append(names, v.name)
			}
		}
		for _, v := range mmvVariants {
			if 8*v.mt < 2*M || v.mt == 1 {
				names = append(names, v.name)
			}
		}
		for _, name := range names {
			b.Run(fmt.Sprintf("M=%d/%s", M, name), func(b *testing.B) {
				x, y := d.Alloc(gpu.F32, M, K), d.Alloc(gpu.F32, M, N)
				defer d.Free(x)
				defer d.Free(y)
				q := d.NewQueue("gemvr").(*Queue)
				d.mmaMatMul = strings.HasPrefix(name, "mm")
				defer func() { d.mmaMatMul = false }()
				switch name {
				case "auto", "mma-auto":
				case "tile", "mma-tile":
					q.tileForce = true
				default:
					if d.mmaMatMul {
						q.mmvForce = name
					} else {
						q.gemvrForce = name
					}
				}
				q.MatMul(y, x, w, gpu.Tensor{})
				if err := q.Sync(); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(2 * N * K))
				b.ResetTimer()
				for range b.N {
					q.MatMul(y, x, w, gpu.Tensor{})
				}
				if err := q.Sync(); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkProductShapes streams the models' decode product shapes — the
// backbone's [8192, 2048] and [2048, 8192] FFN weights and [2048, 2048],
// the depthformer's [1024, 1024] — with M = 1, 4 and 8 rows of x through
// the default FMA pick, the default tensor-core pick and every one-tile
// tensor-core variant (MMVT on the tiled copies), on rows of fp32 and of
// exact bf16 values (x=fp32, x=bf16), each set of weights beyond L2 and
// replayed as one graph (as a step is): bytes are the weights read.
func BenchmarkProductShapes(b *testing.B) {
	d := openGPU(b)
	rng := rand.New(rand.NewPCG(21, 22))
	for _, sh := range []struct{ N, K, sets int }{{8192, 2048, 8}, {2048, 8192, 8}, {2048, 2048, 16}, {1024, 1024, 64}} {
		// Loaded as the model's device loads them, with the tiled copies of
		// the tensor-core products (tiled.go; OMNIPIPE_CUDA_TILED=off: none).
		// openGPU's device is the FMA kernels', which keeps none: before
		// 2026-12-02 02:20 UTC this benchmark timed only the rows.
		d.mmaMatMul = true
		ws := make([]gpu.Tensor, sh.sets)
		for i := range ws {
			ws[i] = loadNormalBF16(b, d, rng, sh.N, sh.K)
		}
		d.mmaMatMul = false
		for _, M := range []int{1, 4, 8} {
			names := []string{"fma", "mma"}
			for _, v := range mmvVariants {
				if v.mt == 1 {
					names = append(names, v.name)
				}
			}
			// x: fp32 rows (three bf16 parts a value on the tensor cores)
			// and rows of exact bf16 values (one part: what the bf16
			// networks multiply).
			for _, name := range names {
				for _, xk := range []string{"fp32", "bf16"} {
					b.Run(fmt.Sprintf("%dx%d/M=%d/%s/x=%s", sh.N, sh.K, M, name, xk), func(b *testing.B) {
						d.mmaMatMul = name != "fma"
						defer func() { d.mmaMatMul = false }()
						q := d.NewQueue("shapes").(*Queue)
						if strings.HasPrefix(name, "mmv") {
							q.mmvForce = name
						}
						x, y := d.Alloc(gpu.F32, M, sh.K), d.Alloc(gpu.F32, M, sh.N)
						defer d.Free(x)
						defer d.Free(y)
						xs := normals(rng, M*sh.K)
						if xk == "bf16" {
							for i := range xs {
								xs[i] = gpu.RoundBF16(xs[i])
							}
						}
						q.Write(x, xs)
						b.SetBytes(int64(sh.sets) * int64(sh.N) * int64(sh.K) * 2)
						timeProductSets(b, q, x, y, ws)
					})
				}
			}
		}
		for _, w := range ws {
			d.Free(w)
		}
	}
}

// BenchmarkConv2D times the conformer subsampling's convolutions at the
// released size (conv2dShapes) on conv2d_rows_f32 and on conv2d_f32.
func BenchmarkConv2D(b *testing.B) {
	d := openGPU(b)
	rng := rand.New(rand.NewPCG(33, 34))
	for _, sh := range conv2dShapes(false) {
		cp, Hout := sh.cp, sh.Hout()
		x := d.Alloc(gpu.F32, sh.H, cp.Cin*cp.W)
		y := d.Alloc(gpu.F32, Hout, sh.Cout*cp.Wout)
		w := loadNormalBF16(b, d, rng, sh.Cout, cp.Cin/cp.Groups*cp.KH*cp.KW)
		for _, direct := range []bool{false, true} {
			name := "rows"
			if direct {
				name = "direct"
			}
			b.Run(sh.name+"/"+name, func(b *testing.B) {
				q := d.NewQueue("conv2d").(*Queue)
				q.conv2dDirect = direct
				q.Write(x, normals(rng, sh.H*cp.Cin*cp.W))
				q.Conv2D(y, x, w, gpu.Tensor{}, cp)
				if err := q.Sync(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for range b.N {
					q.Conv2D(y, x, w, gpu.Tensor{}, cp)
					q.flush()
				}
				if err := q.Sync(); err != nil {
					b.Fatal(err)
				}
			})
		}
		d.Free(x)
		d.Free(y)
		d.Free(w)
	}
}

// BenchmarkEncoderShapes times the conformer's products of one clip (≈ 62
// rows after the 8× subsampling of a 4.9 s clip), a 100-row prefill's and a
// 256-session step's (rows of exact bf16 values) on each tensor-core
// kernel that gives their bits: the default pick, the tile kernels forced
// (mma_bf16_big as mmaBigSplit splits it, and split over 1–16 blocks a
// tile: "/S"), and the few-row kernels forced.
func BenchmarkEncoderShapes(b *testing.B) {
	d := openGPU(b)
	rng := rand.New(rand.NewPCG(35, 36))
	for _, sh := range []struct{ M, N, K int }{{62, 512, 512}, {62, 2048, 512}, {62, 512, 2048}, {62, 1024, 512}, {100, 2048, 2048}, {100, 8192, 2048}, {100, 2048, 8192}, {100, 512, 2048},
		{130, 2048, 2048}, {256, 2048, 2048}, {256, 2048, 8192}, {256, 512, 2048}, {256, 8192, 2048},
		{512, 2048, 2048}, {512, 8192, 2048}, {512, 2048, 8192}, {2048, 2048, 2048}} {
		d.mmaMatMul = true
		ws := []gpu.Tensor{}
		for range 16 {
			ws = append(ws, loadNormalBF16(b, d, rng, sh.N, sh.K))
		}
		d.mmaMatMul = false
		names := []string{"default", "mma_bf16_m32", "mma_bf16_big", "mma_bf16_big/1", "mma_bf16_big/2", "mma_bf16_big/4", "mma_bf16_big/8", "mma_bf16_big/16"}
		if sh.M <= mmvMidMaxRows {
			names = append(names, "mmv_bf16_w16n1m2", "mmv_bf16_w4n1m1")
		}
		for _, name := range names {
			b.Run(fmt.Sprintf("%dx%dx%d/%s", sh.M, sh.N, sh.K, name), func(b *testing.B) {
				d.mmaMatMul = true
				defer func() { d.mmaMatMul = false }()
				q := d.NewQueue("enc").(*Queue)
				switch {
				case strings.HasPrefix(name, "mmv"):
					q.mmvForce = name
				case name != "default":
					q.tileKernel = name
				}
				x, y := d.Alloc(gpu.F32, sh.M, sh.K), d.Alloc(gpu.F32, sh.M, sh.N)
				defer d.Free(x)
				defer d.Free(y)
				xs := normals(rng, sh.M*sh.K)
				for i := range xs {
					xs[i] = gpu.RoundBF16(xs[i])
				}
				q.Write(x, xs)
				b.SetBytes(int64(len(ws)) * int64(sh.N) * int64(sh.K) * 2)
				timeProductSets(b, q, x, y, ws)
			})
		}
		for _, w := range ws {
			d.Free(w)
		}
	}
}

// BenchmarkPromptProducts times a prompt's products (gpu.MatMulPrompt:
// cuBLAS past promptMinRows) against the backend's own (MatMul, the
// default pick) on the backbone's shapes, exact-bf16 rows, sets of weights
// beyond L2 (launched directly either way, as a prefill's batch is).
func BenchmarkPromptProducts(b *testing.B) {
	d := openGPU(b)
	d.mmaMatMul = true
	defer func() { d.mmaMatMul = false }()
	b.Logf("cuBLAS: %s", d.PromptGEMM())
	rng := rand.New(rand.NewPCG(8, 9))
	for _, sh := range []struct{ N, K int }{{8192, 2048}, {2048, 8192}, {2048, 2048}, {6144, 2048}} {
		sets := max(2, (192<<20)/(2*sh.N*sh.K))
		ws := make([]gpu.Tensor, sets)
		for i := range ws {
			ws[i] = loadNormalBF16(b, d, rng, sh.N, sh.K)
		}
		for _, M := range []int{17, 32, 64, 100, 128, 256, 512} {
			for _, prompt := range []bool{false, true} {
				name := "own"
				if prompt {
					name = "cublas"
				}
				b.Run(fmt.Sprintf("N=%d/K=%d/M=%d/%s", sh.N, sh.K, M, name), func(b *testing.B) {
					q := d.NewQueue("bench").(*Queue)
					x, y := d.Alloc(gpu.F32, M, sh.K), d.Alloc(gpu.F32, M, sh.N)
					defer d.Free(x)
					defer d.Free(y)
					xs := normals(rng, M*sh.K)
					for i := range xs {
						xs[i] = gpu.RoundBF16(xs[i])
					}
					q.Write(x, xs)
					mm := q.MatMul
					if prompt {
						mm = q.MatMulPrompt
					}
					for range 2 {
						for _, w := range ws {
							mm(y, x, w, gpu.Tensor{})
						}
						if err := q.Sync(); err != nil {
							b.Fatal(err)
						}
					}
					b.ResetTimer()
					for range b.N {
						for _, w := range ws {
							mm(y, x, w, gpu.Tensor{})
						}
						q.flush()
					}
					if err := q.Sync(); err != nil {
						b.Fatal(err)
					}
					s := b.Elapsed().Seconds() / float64(b.N*len(ws))
					b.ReportMetric(2*float64(M)*float64(sh.N)*float64(sh.K)/s/1e12, "TFLOP/s")
					b.ReportMetric(s*1e6, "µs/product")
				})
			}
		}
		for _, w := range ws {
			d.Free(w)
		}
	}
}
