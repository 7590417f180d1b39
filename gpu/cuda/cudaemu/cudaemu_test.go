package cudaemu

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// build builds the library into a test folder, or skips where the host
// has no C++ compiler.
func build(t *testing.T) string {
	t.Helper()
	lib, err := Build(context.Background(), t.TempDir())
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

func TestBuildIsCached(t *testing.T) {
	dir := t.TempDir()
	a, err := Build(context.Background(), dir)
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(context.Background(), dir)
	if err != nil || a != b {
		t.Fatalf("second build: %q, %v (first %q)", b, err, a)
	}
	out, err := exec.Command("nm", "-D", "--defined-only", a).Output()
	if err != nil {
		t.Skipf("nm: %v", err)
	}
	for _, sym := range []string{"cuInit", "cuLaunchKernelEx", "cuGraphAddDependencies_v2", "nvrtcCompileProgram", "omniCudaEmulator"} {
		if !strings.Contains(string(out), " "+sym+"\n") {
			t.Errorf("the library does not export %s", sym)
		}
	}
}

// selftest compiles testdata/selftest.cpp against the built emu_rt.h with
// extra flags and runs it.
func selftest(t *testing.T, flags ...string) (string, error) {
	t.Helper()
	rt := filepath.Join(filepath.Dir(build(t)), "emu_rt.h")
	bin := filepath.Join(t.TempDir(), "selftest")
	args := append([]string{"-std=c++17", "-O1", "-w", "-include", rt}, flags...)
	args = append(args, "testdata/selftest.cpp", "-o", bin)
	if out, err := exec.Command("g++", args...).CombinedOutput(); err != nil {
		t.Fatalf("compile the self-test: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	return string(out), err
}

// TestSelfTest runs the emulator's built-ins (barriers, shared and
// dynamic shared memory, shuffles, votes, the mma fragment layout, a
// barrier not every thread reaches) against plain host computations.
func TestSelfTest(t *testing.T) {
	out, err := selftest(t)
	if err != nil || !strings.HasPrefix(out, "ok ") {
		t.Fatalf("self-test: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(out))
}

// TestSelfTestCatchesAWrongShuffle plants a fault in the emulator (a
// butterfly shuffle reading the wrong lane): the self-test must fail.
func TestSelfTestCatchesAWrongShuffle(t *testing.T) {
	out, err := selftest(t, "-DEMU_FAULT_SHFL_XOR")
	if err == nil {
		t.Fatalf("the self-test passed with a wrong shuffle:\n%s", out)
	}
	if !strings.Contains(out, "butterfly") {
		t.Errorf("the failure does not name the butterfly:\n%s", out)
	}
}

// TestDriver calls the library's driver and NVRTC entry points as package
// cuda does (testdata/drivertest.cpp): a compile error with its log, direct
// launches with dynamic shared memory, a graph node updated between
// replays, and the failures a GPU reports — a write past an allocation
// (the emulator's guard bytes), a block that cannot finish, a double free.
func TestDriver(t *testing.T) {
	lib := build(t)
	bin := filepath.Join(t.TempDir(), "drivertest")
	if out, err := exec.Command("g++", "-std=c++17", "-O1", "testdata/drivertest.cpp", "-o", bin, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("compile the driver test: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, lib).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok ") {
		t.Fatalf("driver test: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(string(out)))
}
