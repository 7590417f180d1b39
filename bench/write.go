package bench

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// chunkElems is the number of values one job draws: the unit of parallel
// work and of a tensor's random stream.
const chunkElems = 1 << 20

// planned is a safetensors file laid out: its header and each tensor's
// place in the data.
type planned struct {
	header []byte // length prefix, JSON, padding
	specs  []TensorSpec
	offs   []int64 // data offset of each spec, from the start of the file
	size   int64
}

// plan sorts specs by name (as the reference writer does) and lays them
// out back to back after the header.
func plan(specs []TensorSpec, metadata map[string]string) (*planned, error) {
	p := &planned{specs: append([]TensorSpec(nil), specs...)}
	sort.Slice(p.specs, func(i, j int) bool { return p.specs[i].Name < p.specs[j].Name })
	hdr := make(map[string]any, len(specs)+1)
	if len(metadata) > 0 {
		hdr["__metadata__"] = metadata
	}
	var off int64
	for i, s := range p.specs {
		if i > 0 && p.specs[i-1].Name == s.Name {
			return nil, fmt.Errorf("bench: duplicate tensor %q", s.Name)
		}
		if dtypeSize(s.DType) == 0 {
			return nil, fmt.Errorf("bench: tensor %q: dtype %s is not one of BF16, F32, I64, F64", s.Name, s.DType)
		}
		for _, d := range s.Shape {
			if d < 0 {
				return nil, fmt.Errorf("bench: tensor %q has shape %v", s.Name, s.Shape)
			}
		}
		shape := s.Shape
		if shape == nil {
			shape = []int{}
		}
		n := s.Bytes()
		hdr[s.Name] = map[string]any{"dtype": s.DType, "shape": shape, "data_offsets": []int64{off, off + n}}
		p.offs = append(p.offs, off)
		off += n
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return nil, fmt.Errorf("bench: safetensors header: %w", err)
	}
	for len(js)%8 != 0 { // keep the data 8-byte aligned
		js = append(js, ' ')
	}
	p.header = binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	p.header = append(p.header, js...)
	base := int64(len(p.header))
	for i := range p.offs {
		p.offs[i] += base
	}
	p.size = base + off
	return p, nil
}

// sink receives a file's bytes from parallel workers.
type sink interface {
	// buf returns a buffer for n bytes at offset off of the file.
	buf(worker int, off int64, n int) []byte
	// put stores b, filled, at off.
	put(off int64, b []byte) error
}

type memSink []byte

func (m memSink) buf(_ int, off int64, n int) []byte { return m[off : off+int64(n)] }
func (m memSink) put(int64, []byte) error            { return nil }

type fileSink struct {
	f       *os.File
	scratch [][]byte
}

func (s *fileSink) buf(w int, _ int64, n int) []byte {
	if cap(s.scratch[w]) < n {
		s.scratch[w] = make([]byte, n)
	}
	return s.scratch[w][:n]
}

func (s *fileSink) put(off int64, b []byte) error {
	_, err := s.f.WriteAt(b, off)
	return err
}

// Safetensors returns a safetensors file holding specs with values drawn
// from seed. A tensor's values depend only on seed and its name, so a
// subset of a checkpoint's specs gives the same tensors as the whole.
func Safetensors(specs []TensorSpec, seed uint64, metadata map[string]string) ([]byte, error) {
	p, err := plan(specs, metadata)
	if err != nil {
		return nil, err
	}
	data := make([]byte, p.size)
	copy(data, p.header)
	if err := p.fill(memSink(data), seed); err != nil {
		return nil, err
	}
	return data, nil
}

// WriteSafetensors writes the file Safetensors would return to path.
func WriteSafetensors(path string, specs []TensorSpec, seed uint64, metadata map[string]string) (err error) {
	p, err := plan(specs, metadata)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	if err := f.Truncate(p.size); err != nil {
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	if _, err := f.WriteAt(p.header, 0); err != nil {
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	s := &fileSink{f: f, scratch: make([][]byte, runtime.GOMAXPROCS(0))}
	if err := p.fill(s, seed); err != nil {
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	return nil
}

type job struct {
	spec  int
	chunk int64
}

// fill draws every tensor's values on GOMAXPROCS workers, one chunk of
// chunkElems values per job.
func (p *planned) fill(out sink, seed uint64) error {
	tables := map[tableKey]*table{}
	var jobs []job
	for i, s := range p.specs {
		if k, ok := keyOf(s); ok && tables[k] == nil {
			tables[k] = newTable(k)
		}
		for c := int64(0); c*chunkElems < s.Len(); c++ {
			jobs = append(jobs, job{i, c})
		}
	}
	workers := min(runtime.GOMAXPROCS(0), max(1, len(jobs)))
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := next.Add(1) - 1
				if j >= int64(len(jobs)) || errs[w] != nil {
					return
				}
				s := &p.specs[jobs[j].spec]
				first := jobs[j].chunk * chunkElems
				n := min(chunkElems, s.Len()-first)
				size := int64(dtypeSize(s.DType))
				off := p.offs[jobs[j].spec] + first*size
				b := out.buf(w, off, int(n*size))
				k, _ := keyOf(*s)
				draw(b, s, tables[k], streamSeed(seed, s.Name, jobs[j].chunk), first)
				errs[w] = out.put(off, b)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// streamSeed is the seed of one chunk's random stream.
func streamSeed(seed uint64, name string, chunk int64) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	x := seed ^ h.Sum64() ^ uint64(chunk)*0x9e3779b97f4a7c15
	return splitmix(&x)
}

// splitmix advances a SplitMix64 state and returns its next output.
func splitmix(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// tableKey identifies a quantile table: a distribution in a dtype.
type tableKey struct {
	init Init
	dt   safetensors.DType
}

func keyOf(s TensorSpec) (tableKey, bool) {
	switch s.Init.Dist {
	case Normal, Uniform, LogNormal:
		return tableKey{s.Init, s.DType}, true
	}
	return tableKey{}, false
}

// table holds the 65536 quantiles (i + ½)/65536 of a distribution,
// encoded in the dtype: a 16-bit random index then draws one value.
type table struct {
	u16 []uint16 // BF16
	u32 []uint32 // F32
	u64 []uint64 // F64, I64
}

func newTable(k tableKey) *table {
	t := &table{}
	vals := make([]float64, 1<<16)
	for i := range vals {
		p := (float64(i) + 0.5) / (1 << 16)
		switch k.init.Dist {
		case Normal:
			vals[i] = k.init.A + k.init.B*math.Sqrt2*math.Erfinv(2*p-1)
		case Uniform:
			vals[i] = k.init.A + (k.init.B-k.init.A)*p
		case LogNormal:
			vals[i] = math.Exp(k.init.A + k.init.B*math.Sqrt2*math.Erfinv(2*p-1))
		}
	}
	switch dtypeSize(k.dt) {
	case 2:
		t.u16 = make([]uint16, len(vals))
		for i, v := range vals {
			t.u16[i] = encode16(k.dt, v)
		}
	case 4:
		t.u32 = make([]uint32, len(vals))
		for i, v := range vals {
			t.u32[i] = math.Float32bits(float32(v))
		}
	default:
		t.u64 = make([]uint64, len(vals))
		for i, v := range vals {
			t.u64[i] = encode64(k.dt, v)
		}
	}
	return t
}

func encode16(_ safetensors.DType, v float64) uint16 { return gpu.F32ToBF16(float32(v)) }

func encode64(dt safetensors.DType, v float64) uint64 {
	if dt == safetensors.I64 {
		return uint64(int64(v))
	}
	return math.Float64bits(v)
}

// draw fills b with the values first, first+1, … of spec s.
func draw(b []byte, s *TensorSpec, t *table, seed uint64, first int64) {
	size := dtypeSize(s.DType)
	n := len(b) / size
	if t == nil { // Const, Arange
		for i := 0; i < n; i++ {
			v := s.Init.A + float64(first+int64(i))*s.Init.B
			if s.Init.Dist == Const {
				v = s.Init.A
			}
			switch size {
			case 2:
				binary.LittleEndian.PutUint16(b[2*i:], encode16(s.DType, v))
			case 4:
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
			default:
				binary.LittleEndian.PutUint64(b[8*i:], encode64(s.DType, v))
			}
		}
		return
	}
	x := seed
	i := 0
	switch size {
	case 2:
		for ; i+4 <= n; i += 4 {
			r := splitmix(&x)
			binary.LittleEndian.PutUint16(b[2*i:], t.u16[uint16(r)])
			binary.LittleEndian.PutUint16(b[2*i+2:], t.u16[uint16(r>>16)])
			binary.LittleEndian.PutUint16(b[2*i+4:], t.u16[uint16(r>>32)])
			binary.LittleEndian.PutUint16(b[2*i+6:], t.u16[uint16(r>>48)])
		}
	case 4:
		for ; i+4 <= n; i += 4 {
			r := splitmix(&x)
			binary.LittleEndian.PutUint32(b[4*i:], t.u32[uint16(r)])
			binary.LittleEndian.PutUint32(b[4*i+4:], t.u32[uint16(r>>16)])
			binary.LittleEndian.PutUint32(b[4*i+8:], t.u32[uint16(r>>32)])
			binary.LittleEndian.PutUint32(b[4*i+12:], t.u32[uint16(r>>48)])
		}
	}
	// The tail (and 8-byte dtypes), one index at a time.
	r, left := uint64(0), 0
	for ; i < n; i++ {
		if left == 0 {
			r, left = splitmix(&x), 4
		}
		idx := uint16(r)
		r >>= 16
		left--
		switch size {
		case 2:
			binary.LittleEndian.PutUint16(b[2*i:], t.u16[idx])
		case 4:
			binary.LittleEndian.PutUint32(b[4*i:], t.u32[idx])
		default:
			binary.LittleEndian.PutUint64(b[8*i:], t.u64[idx])
		}
	}
}
