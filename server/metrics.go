package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

// metrics are one server's Prometheus metrics, in its own registry (so
// that several servers, as in tests, never collide).
type metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec // route, code
	errors     *prometheus.CounterVec // kind
	turns      *prometheus.CounterVec // outcome
	prefill    prometheus.Histogram   // seconds
	firstText  prometheus.Histogram   // seconds
	firstAudio prometheus.Histogram   // seconds
	total      prometheus.Histogram   // seconds
	rtf        prometheus.Histogram   // total / audio seconds
	busy       *prometheus.CounterVec // stage
	audioOut   prometheus.Counter     // seconds of speech
	steps      prometheus.Counter     // backbone steps
	info       *prometheus.GaugeVec   // model, backend, version
}

const ns = "omnipipe"

// memoryJSON is /health's memory: the engine's and the stored
// conversations' share of it.
type memoryJSON struct {
	pipeline.MemoryStats
	Conversations int64 `json:"conversations_bytes"`
}

func newMetrics(active, queued, convs func() float64, device func() (gpu.Info, bool), memory func() (pipeline.MemoryStats, bool)) *metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	lat := []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "http_requests_total",
			Help: "HTTP requests by route and status code."}, []string{"route", "code"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "errors_total",
			Help: "Errors returned to clients, by kind (the error body's code)."}, []string{"kind"}),
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "turns_total",
			Help: "Turns that ran, by outcome (end_of_turn, max_tokens, cancelled, failed)."}, []string{"outcome"}),
		prefill: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "prefill_seconds",
			Help: "Time from a turn's start until its prompt was computed.", Buckets: lat}),
		firstText: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "first_text_seconds",
			Help: "Time from a turn's start to its first text.", Buckets: lat}),
		firstAudio: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "first_audio_seconds",
			Help: "Time from a turn's start to its first decoded audio frame.", Buckets: lat}),
		total: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "turn_seconds",
			Help: "Total time of a turn.", Buckets: lat}),
		rtf: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "real_time_factor",
			Help:    "A turn's total time over the seconds of speech it produced (below 1: faster than real time).",
			Buckets: []float64{.05, .1, .2, .3, .5, .75, 1, 1.5, 2, 5}}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "stage_busy_seconds_total",
			Help: "Compute time each pipeline stage spent on turns."}, []string{"stage"}),
		audioOut: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "audio_output_seconds_total",
			Help: "Seconds of speech produced."}),
		steps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "backbone_steps_total",
			Help: "Backbone steps (text tokens and audio frames) generated."}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "build_info",
			Help: "The served model, backend and version (value 1)."}, []string{"model", "backend", "version"}),
	}
	reg.MustRegister(m.requests, m.errors, m.turns, m.prefill, m.firstText, m.firstAudio, m.total, m.rtf,
		m.busy, m.audioOut, m.steps, m.info,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "active_turns",
			Help: "Turns holding a slot (generating)."}, active),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "queued_requests",
			Help: "Requests waiting for a turn slot."}, queued),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "conversations",
			Help: "Conversations held in memory."}, convs),
		newDeviceCollector(device), newMemoryCollector(memory))
	return m
}

// deviceCollector reports the engine's device as it is at each scrape:
// omnipipe_device_info (value 1, labels kind, name, driver),
// omnipipe_device_memory_used_bytes and, where the device has a size,
// omnipipe_device_memory_total_bytes. Nothing while the model loads.
type deviceCollector struct {
	device            func() (gpu.Info, bool)
	info, used, total *prometheus.Desc
}

func newDeviceCollector(device func() (gpu.Info, bool)) *deviceCollector {
	return &deviceCollector{
		device: device,
		info: prometheus.NewDesc(ns+"_device_info", "The device the engine runs on (value 1).",
			[]string{"kind", "name", "driver"}, nil),
		used: prometheus.NewDesc(ns+"_device_memory_used_bytes",
			"Device memory this process holds in buffers (on the CPU: the backend's buffers, not mapped weights).", nil, nil),
		total: prometheus.NewDesc(ns+"_device_memory_total_bytes", "The device's memory (absent where not meaningful).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (d *deviceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- d.info
	ch <- d.used
	ch <- d.total
}

// Collect implements prometheus.Collector.
func (d *deviceCollector) Collect(ch chan<- prometheus.Metric) {
	info, ok := d.device()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(d.info, prometheus.GaugeValue, 1, info.Kind, info.Name, info.Driver)
	ch <- prometheus.MustNewConstMetric(d.used, prometheus.GaugeValue, float64(info.MemUsed))
	if info.MemTotal > 0 {
		ch <- prometheus.MustNewConstMetric(d.total, prometheus.GaugeValue, float64(info.MemTotal))
	}
}

// memoryCollector reports the engine's memory at each scrape:
// omnipipe_memory_budget_bytes and omnipipe_memory_used_bytes{kind} (kv,
// history, codec). Nothing while the model loads.
type memoryCollector struct {
	memory       func() (pipeline.MemoryStats, bool)
	budget, used *prometheus.Desc
}

func newMemoryCollector(memory func() (pipeline.MemoryStats, bool)) *memoryCollector {
	return &memoryCollector{memory: memory,
		budget: prometheus.NewDesc(ns+"_memory_budget_bytes", "The engine's memory budget for KV caches, history and codec state.", nil, nil),
		used: prometheus.NewDesc(ns+"_memory_used_bytes", "Bytes of the memory budget in use, by kind (kv, history, codec).",
			[]string{"kind"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *memoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.budget
	ch <- m.used
}

// Collect implements prometheus.Collector.
func (m *memoryCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := m.memory()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(m.budget, prometheus.GaugeValue, float64(st.Budget))
	for _, kv := range []struct {
		kind string
		n    int64
	}{{"kv", st.KV}, {"history", st.History}, {"codec", st.Codec}} {
		ch <- prometheus.MustNewConstMetric(m.used, prometheus.GaugeValue, float64(kv.n), kv.kind)
	}
}

// request counts a finished request.
func (m *metrics) request(route string, code int) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
}

// turn records a finished turn's timings.
func (m *metrics) turn(outcome string, tm pipeline.Timings) {
	m.turns.WithLabelValues(outcome).Inc()
	if tm.Prefill > 0 {
		m.prefill.Observe(tm.Prefill.Seconds())
	}
	if tm.FirstText > 0 {
		m.firstText.Observe(tm.FirstText.Seconds())
	}
	if tm.FirstAudio > 0 {
		m.firstAudio.Observe(tm.FirstAudio.Seconds())
	}
	m.total.Observe(tm.Total.Seconds())
	if tm.AudioSeconds > 0 {
		m.rtf.Observe(tm.RTF)
		m.audioOut.Add(tm.AudioSeconds)
	}
	m.steps.Add(float64(tm.Steps))
	for stage, d := range tm.Busy {
		m.busy.WithLabelValues(stage).Add(d.Seconds())
	}
}

// registerDecode adds the decode budget's gauges:
// omnipipe_decode_budget_bytes and omnipipe_decode_used_bytes.
func (m *metrics) registerDecode(budget int64, used func() float64) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "decode_budget_bytes",
			Help: "The memory that request bodies being read and decoded may hold at once (--decode-budget)."},
			func() float64 { return float64(budget) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "decode_used_bytes",
			Help: "The decode budget's bytes reserved by request bodies and realtime events being read and decoded."}, used))
}
