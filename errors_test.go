package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice"
)

func TestIsInvalid(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{sluice.Request{Key: "k", Cost: 1, Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}}.Validate(), true},
		{sluice.Request{Policy: "p", Key: "", Cost: 1, Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}}.Validate(), true},
		{sluice.Request{Policy: "p", Key: "k", Cost: 2, Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}}.Validate(), true},
		{sluice.Limit{}.Validate(), true},
		{fmt.Errorf("store: %w", sluice.ErrInvalidRequestID), true},
		{fmt.Errorf("store: %w", sluice.ErrRequestIDConflict), true},
		{fmt.Errorf("store: %w", sluice.ErrTooManyKeys), false},
		{fmt.Errorf("store: %w", sluice.ErrUnavailable), false},
		{fmt.Errorf("store: %w", sluice.ErrMisconfigured), false},
		{context.DeadlineExceeded, false},
		{errors.New("connection refused"), false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := sluice.IsInvalid(tt.err); got != tt.want {
			t.Errorf("IsInvalid(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestIsUnavailable(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("redis: %w: %w", sluice.ErrUnavailable, errors.New("connection refused")), true},
		{fmt.Errorf("pg: %w", sluice.ErrMisconfigured), false},
		{fmt.Errorf("x: %w", sluice.ErrInvalidKey), false},
		{context.DeadlineExceeded, false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := sluice.IsUnavailable(tt.err); got != tt.want {
			t.Errorf("IsUnavailable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
