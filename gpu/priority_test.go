package gpu

import "testing"

type plainDevice struct {
	Device
	made []string
}

func (d *plainDevice) NewQueue(name string) Queue {
	d.made = append(d.made, "queue "+name)
	return nil
}

type urgencyDevice struct{ plainDevice }

func (d *urgencyDevice) NewBackgroundQueue(name string) Queue {
	d.made = append(d.made, "background "+name)
	return nil
}

func TestNewBackgroundQueue(t *testing.T) {
	p := &plainDevice{}
	NewBackgroundQueue(p, "codec")
	u := &urgencyDevice{}
	NewBackgroundQueue(u, "codec")
	if len(p.made) != 1 || p.made[0] != "queue codec" {
		t.Errorf("a device without background queues made %v, want an ordinary queue", p.made)
	}
	if len(u.made) != 1 || u.made[0] != "background codec" {
		t.Errorf("a device with background queues made %v, want its background queue", u.made)
	}
}
