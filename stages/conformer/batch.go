package conformer

import "github.com/omni-pipe/omni-pipe/gpu"

// clips is the row layout of a batch of clips: every activation holds the
// clips' rows one after another, clip i at rows [off[i], off[i]+n[i]).
// Row-wise ops (products, norms, activations, roundings, residuals) run
// once over all rows; an op that mixes rows within a clip (a convolution
// along time, attention) runs on each clip's view.
type clips struct {
	n, off []int
	rows   int // Σ n
	max    int // the longest clip's rows
}

// layout returns the layout of clips of n[i] rows each.
func layout(n []int) clips {
	l := clips{n: n, off: make([]int, len(n))}
	for i, k := range n {
		l.off[i] = l.rows
		l.rows += k
		l.max = max(l.max, k)
	}
	return l
}

// view returns clip i's rows of x.
func (l clips) view(x gpu.Tensor, i int) gpu.Tensor { return x.Slice(l.off[i], l.off[i]+l.n[i]) }

// halved is the layout after a stride-2 convolution along time.
func (l clips) halved() clips {
	n := make([]int, len(l.n))
	for i, k := range l.n {
		n[i] = halve(k)
	}
	return layout(n)
}
