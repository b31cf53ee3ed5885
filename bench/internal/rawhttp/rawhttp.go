// Package rawhttp is the HTTP/1.1 client of the benchmarks' load
// generators (bench/http, bench/gubernator): one keep-alive connection per
// request slot, at less CPU time per request than net/http's client.
package rawhttp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"time"
)

// maxAnswer bounds the body of an answer the raw sender reads.
const maxAnswer = 64 << 20

// Sender speaks just enough HTTP/1.1 over one keep-alive connection to
// post a body and read the answer: a status line, header fields of which
// it reads Content-Length, Transfer-Encoding and Connection, and a body of
// known length or chunked. It costs the machine less CPU time per request
// than net/http's client, which on a machine the service shares leaves
// more for the service. It redials after an error or a "Connection:
// close".
type Sender struct {
	addr    string
	head    []byte // the request line and fields, up to the Content-Length value
	timeout time.Duration
	conn    net.Conn
	br      *bufio.Reader
	wbuf    []byte
}

// New returns a sender posting to u, with the bearer token if not empty,
// each request and answer bounded by timeout.
func New(u *url.URL, token string, timeout time.Duration) *Sender {
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	head := []byte("POST " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\nContent-Type: application/json\r\n")
	if token != "" {
		head = append(head, "Authorization: Bearer "+token+"\r\n"...)
	}
	head = append(head, "Content-Length: "...)
	return &Sender{addr: addr, head: head, timeout: timeout}
}

// Send posts body and appends the answer's body to answer, returning its
// status; an error means there was no answer.
func (s *Sender) Send(body []byte, answer *bytes.Buffer) (int, error) {
	if s.conn == nil {
		c, err := net.DialTimeout("tcp", s.addr, s.timeout)
		if err != nil {
			return 0, err
		}
		s.conn = c
		if s.br == nil {
			s.br = bufio.NewReaderSize(c, 32<<10)
		} else {
			s.br.Reset(c)
		}
	}
	status, keep, err := s.roundTrip(body, answer)
	if err != nil || !keep {
		s.Close()
	}
	return status, err
}

func (s *Sender) roundTrip(body []byte, answer *bytes.Buffer) (status int, keep bool, err error) {
	if err := s.conn.SetDeadline(time.Now().Add(s.timeout)); err != nil {
		return 0, false, err
	}
	s.wbuf = append(s.wbuf[:0], s.head...)
	s.wbuf = strconv.AppendInt(s.wbuf, int64(len(body)), 10)
	s.wbuf = append(s.wbuf, "\r\n\r\n"...)
	s.wbuf = append(s.wbuf, body...)
	if _, err := s.conn.Write(s.wbuf); err != nil {
		return 0, false, err
	}
	line, err := s.line()
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, false, fmt.Errorf("status line %.100q is not HTTP/1.x", line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil || status < 200 {
		return 0, false, fmt.Errorf("status line %.100q: want a final status", line)
	}
	keep = line[7] == '1' // HTTP/1.0 closes by default
	length, chunked := int64(-1), false
	for {
		line, err := s.line()
		if err != nil {
			return 0, false, err
		}
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, fmt.Errorf("header line %.100q has no colon", line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			length, err = strconv.ParseInt(string(value), 10, 64)
			if err != nil || length < 0 || length > maxAnswer {
				return 0, false, fmt.Errorf("Content-Length %.40q: want 0 to %d", value, maxAnswer)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
			if !chunked {
				return 0, false, fmt.Errorf("Transfer-Encoding %.40q is not chunked", value)
			}
		case bytes.EqualFold(name, []byte("Connection")):
			switch {
			case bytes.EqualFold(value, []byte("close")):
				keep = false
			case bytes.EqualFold(value, []byte("keep-alive")):
				keep = true
			}
		}
	}
	switch {
	case chunked:
		err = s.chunks(answer)
	case length >= 0:
		_, err = io.CopyN(answer, s.br, length)
	default:
		// No length: the body runs to the end of the connection.
		_, err = answer.ReadFrom(io.LimitReader(s.br, maxAnswer))
		keep = false
	}
	if err != nil {
		return 0, false, err
	}
	return status, keep, nil
}

// line reads one line of the head of an answer, without its CRLF.
func (s *Sender) line() ([]byte, error) {
	line, err := s.br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("a header line is over %d bytes", s.br.Size())
		}
		return nil, err
	}
	return bytes.TrimSuffix(line[:len(line)-1], []byte("\r")), nil
}

// chunks reads a chunked body into answer, and the trailer after it.
func (s *Sender) chunks(answer *bytes.Buffer) error {
	for {
		line, err := s.line()
		if err != nil {
			return err
		}
		size, _, _ := bytes.Cut(line, []byte(";"))
		n, err := strconv.ParseInt(string(bytes.TrimSpace(size)), 16, 64)
		if err != nil || n < 0 || int64(answer.Len())+n > maxAnswer {
			return fmt.Errorf("chunk size %.40q: want a hexadecimal size, at most %d in all", line, maxAnswer)
		}
		if n == 0 {
			for { // the trailer, up to an empty line
				line, err := s.line()
				if err != nil || len(line) == 0 {
					return err
				}
			}
		}
		if _, err := io.CopyN(answer, s.br, n); err != nil {
			return err
		}
		line, err = s.line()
		if err != nil {
			return err
		}
		if len(line) != 0 {
			return fmt.Errorf("a chunk of %d bytes is followed by %.40q, not CRLF", n, line)
		}
	}
}

// Close closes the connection.
func (s *Sender) Close() {
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}
