package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

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

func newMetrics(active, queued, convs func() float64) *metrics {
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
			Help: "Conversations held in memory."}, convs))
	return m
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
