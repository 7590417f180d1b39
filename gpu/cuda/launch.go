package cuda

import (
	"unsafe"

	"github.com/ebitengine/purego"
)

// Programmatic dependent launch (compute capability 9.0 and later). A
// kernel launched this way may be scheduled while the kernel before it in
// its stream still runs; it then waits in griddepcontrol.wait until that
// kernel has completed and its writes are visible (kernels.cu: every
// kernel begins with PDL_ENTER, after at most an L2 prefetch of its
// weights or, for a few, reads of their uploaded tables, which no kernel
// writes). The next kernel's launch latency and its weights' first trip
// from memory overlap the current kernel's work instead of following it:
// a one-session decode step is ≈ 140 dependent kernels, a depthformer
// frame ≈ 470, each of which otherwise pays a launch and a ramp. Directly
// launched kernels carry the stream-serialization attribute; a graph's
// kernel nodes are chained by programmatic edges. Env
// OMNIPIPE_CUDA_PDL=off (Options.NoPDL) launches as before, for A/B
// measurements; profiling (which times kernels one by one) turns it off.

// CUlaunchAttributeID and CUgraphEdgeData values (cuda.h).
const (
	launchAttrProgrammaticSerialization = 6 // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
	graphPortProgrammatic               = 1 // CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
	graphDependencyProgrammatic         = 1 // CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
)

// launchAttr is CUlaunchAttribute: an id and a 64-byte value union.
type launchAttr struct {
	id  uint32
	_   uint32
	val [64]byte
}

// launchConfig is CUlaunchConfig.
type launchConfig struct {
	gx, gy, gz, bx, by, bz, shm uint32
	_                           uint32
	stream                      uintptr
	attrs                       *launchAttr
	nattrs                      uint32
	_                           uint32
}

// graphEdge is CUgraphEdgeData.
type graphEdge struct {
	fromPort, toPort, typ uint8
	_                     [5]uint8
}

// pdlUsable reports whether kernels may be launched programmatically: a
// GPU of compute capability 9.0 or later, a driver with both entry points,
// not turned off, not profiling.
func pdlUsable(ccMajor int, c *driver, off, profiling bool) bool {
	return ccMajor >= 9 && c.cuLaunchKernelEx != 0 && c.cuGraphAddDependencies != 0 && !off && !profiling
}

// pdlConfig fills the launch configuration of cm on stream s with the
// programmatic serialization attribute set in attr.
func pdlConfig(cm cmd, s uintptr, attr *launchAttr) launchConfig {
	*attr = launchAttr{id: launchAttrProgrammaticSerialization}
	attr.val[0] = 1
	return launchConfig{
		gx: cm.grid[0], gy: cm.grid[1], gz: cm.grid[2], bx: cm.block[0], by: cm.block[1], bz: 1,
		shm: cm.shm, stream: s, attrs: attr, nattrs: 1,
	}
}

// launchPDL launches cm on q's stream with the programmatic serialization
// attribute (owner thread).
func (q *Queue) launchPDL(cm cmd, pp uintptr) error {
	c := q.d.drv
	var attr launchAttr
	cfg := pdlConfig(cm, q.stream, &attr)
	res, _, _ := purego.SyscallN(c.cuLaunchKernelEx, uintptr(unsafe.Pointer(&cfg)), cm.fn, pp, 0)
	if res != 0 {
		return c.err("cuLaunchKernelEx", result(res))
	}
	return nil
}

// addProgrammaticEdge makes graph node to depend programmatically on from.
func addProgrammaticEdge(c *driver, graph, from, to uintptr) error {
	e := graphEdge{fromPort: graphPortProgrammatic, typ: graphDependencyProgrammatic}
	return c.call("cuGraphAddDependencies", c.cuGraphAddDependencies, graph,
		uintptr(unsafe.Pointer(&from)), uintptr(unsafe.Pointer(&to)), uintptr(unsafe.Pointer(&e)), 1)
}
