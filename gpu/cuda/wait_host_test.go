package cuda

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEvents stands in for cuEventQuery: an event is pending until done
// marks it, or failed.
type fakeEvents struct {
	mu     sync.Mutex
	state  map[uintptr]result
	polled atomic.Int64
}

func (f *fakeEvents) query(ev uintptr) result {
	f.polled.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.state[ev]; ok {
		return r
	}
	return errNotReady
}

func (f *fakeEvents) set(ev uintptr, r result) {
	f.mu.Lock()
	f.state[ev] = r
	f.mu.Unlock()
}

// waitTestDevice is a Device with only its owner loop: closures and the
// wait list, events answered by fake.
func waitTestDevice(fake *fakeEvents) *Device {
	d := &Device{drv: &driver{}, work: make(chan func()), exited: make(chan struct{}), query: fake.query}
	go func() {
		defer close(d.exited)
		d.serve()
	}()
	return d
}

func closeWaitTestDevice(d *Device) {
	d.mu.Lock()
	d.closed = true
	close(d.work)
	d.mu.Unlock()
	<-d.exited
}

// TestOwnerRunsClosuresWhileWaiting: a goroutine waiting for an event does
// not hold the owner thread — other closures run meanwhile — and is
// released when the event completes, or gets the failure.
func TestOwnerRunsClosuresWhileWaiting(t *testing.T) {
	fake := &fakeEvents{state: map[uintptr]result{}}
	d := waitTestDevice(fake)
	defer closeWaitTestDevice(d)

	waited := make(chan error, 1)
	go func() { waited <- d.doWait(func() (uintptr, error) { return 7, nil }) }()
	// The owner keeps serving closures while event 7 is pending.
	deadline := time.Now().Add(5 * time.Second)
	for fake.polled.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for i := range 100 {
		ran := false
		if err := d.do(func() error { ran = true; return nil }); err != nil || !ran {
			t.Fatalf("closure %d behind a pending wait: ran %v, %v", i, ran, err)
		}
	}
	select {
	case err := <-waited:
		t.Fatalf("released before its event completed: %v", err)
	default:
	}
	fake.set(7, cudaSuccess)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not released after its event completed")
	}

	// A failed event fails its waiter with the code; one waiting longer
	// than the spin (the owner naps between polls) is still released.
	fake.set(8, 719)
	if err := d.awaitEvent(8); err == nil {
		t.Fatal("a failed event released its waiter without an error")
	} else if e := (*Error)(nil); !errors.As(err, &e) || e.Code != 719 {
		t.Fatalf("failed event: %v", err)
	}
	go func() { waited <- d.awaitEvent(9) }()
	time.Sleep(spinFor + 20*time.Millisecond)
	fake.set(9, cudaSuccess)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a wait past the spin was not released")
	}
	// A closure that fails registers no wait.
	boom := errors.New("boom")
	if err := d.doWait(func() (uintptr, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("doWait = %v, want boom", err)
	}
}

// TestOwnerCloseReleasesWaiters: closing the device's work channel with a
// wait pending ends the owner only once the waiter is released.
func TestOwnerCloseReleasesWaiters(t *testing.T) {
	fake := &fakeEvents{state: map[uintptr]result{}}
	d := waitTestDevice(fake)
	waited := make(chan error, 1)
	go func() { waited <- d.awaitEvent(3) }()
	for fake.polled.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	d.mu.Lock()
	d.closed = true
	close(d.work)
	d.mu.Unlock()
	select {
	case <-d.exited:
		t.Fatal("the owner ended with a waiter still blocked")
	case <-time.After(20 * time.Millisecond):
	}
	fake.set(3, cudaSuccess)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	<-d.exited
}

// TestEvictedUploadMemoryIsReused: a graph evicted from a full cache keeps
// its upload memory on the queue (no wait for the device, no free) and a
// new graph adopts it once the device has finished reading it; the spare
// list stays bounded.
func TestEvictedUploadMemoryIsReused(t *testing.T) {
	fake := &fakeEvents{state: map[uintptr]result{}}
	q := hostQueue()
	q.d.query = fake.query
	q.retire(staging{host: 0x1000, dev: 0x1000, n: 1 << 16, ev: 5, pending: true})
	var st staging
	if q.adoptSpare(&st, 100) {
		t.Fatal("adopted upload memory the device is still reading")
	}
	fake.set(5, cudaSuccess)
	if q.adoptSpare(&st, 1<<17) {
		t.Fatal("adopted upload memory too small for the batch")
	}
	if !q.adoptSpare(&st, 100) || st.host != 0x1000 || st.ev != 5 || st.pending {
		t.Fatalf("adopted %+v, want the retired memory, no longer pending", st)
	}
	if len(q.spare) != 0 {
		t.Fatalf("%d spares left after the adoption", len(q.spare))
	}
	for i := range maxSpare {
		q.retire(staging{n: 1 << 16, ev: uintptr(100 + i)}) // host 0: nothing for free to release
	}
	if len(q.spare) != maxSpare {
		t.Fatalf("%d spares, want %d", len(q.spare), maxSpare)
	}
}
