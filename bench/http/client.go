package main

import (
	"bytes"
	"net/http"
	"time"
)

// stdSender sends through net/http's client, shared by every request slot.
type stdSender struct {
	url    string
	header http.Header // shared by every request, never written to
	client *http.Client
	tr     *http.Transport
}

func newStdSender(target, token string, conns int, timeout time.Duration) *stdSender {
	tr := &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	s := &stdSender{
		url:    target,
		header: http.Header{"Content-Type": {"application/json"}},
		client: &http.Client{Transport: tr, Timeout: timeout},
		tr:     tr,
	}
	if token != "" {
		s.header["Authorization"] = []string{"Bearer " + token}
	}
	return s
}

func (s *stdSender) Send(body []byte, answer *bytes.Buffer) (int, error) {
	req, err := http.NewRequest(http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header = s.header
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := answer.ReadFrom(resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

func (s *stdSender) Close() { s.tr.CloseIdleConnections() }
