//go:build amd64 && !purego

package cpu

import "golang.org/x/sys/cpu"

// haveAsm reports whether the CPU (and OS) run the AVX2+FMA+F16C kernels.
var haveAsm = cpu.X86.HasAVX2 && cpu.X86.HasFMA && hasF16C()

// hasF16C reports CPUID.1:ECX.F16C[bit 29] (x/sys/cpu does not export it).
func hasF16C() bool {
	_, _, c, _ := cpuid(1, 0)
	return c&(1<<29) != 0
}

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
