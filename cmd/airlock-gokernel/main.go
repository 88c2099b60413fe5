// Command airlock-gokernel is the Jupyter kernel for Go in Airlock's code-interpreter
// image (package gokernel). Jupyter starts it from its kernelspec:
//
//	airlock-gokernel {connection_file}
//
// SIGINT interrupts the running cell; SIGTERM ends the kernel.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/airlockdev/airlock/execd/jupyter"
	"github.com/airlockdev/airlock/gokernel"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "-h" || os.Args[1] == "--help" {
		fmt.Fprintln(os.Stderr, "usage: airlock-gokernel CONNECTION_FILE")
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	conn, err := jupyter.ReadConnection(os.Args[1])
	if err != nil {
		log.Error("connection file", "err", err)
		os.Exit(1)
	}
	k, err := gokernel.New(conn, log)
	if err != nil {
		log.Error("kernel start", "err", err)
		os.Exit(1)
	}
	defer k.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	sigint := make(chan os.Signal, 1)
	signal.Notify(sigint, os.Interrupt)
	go func() {
		for range sigint {
			k.Interrupt()
		}
	}()
	if err := k.Run(ctx); err != nil {
		log.Error("kernel", "err", err)
		os.Exit(1)
	}
}
