package ebpf

//go:generate go tool bpf2go -go-package ebpf -tags linux -target bpfel -type event -type sbx_cfg -type sbx_meta -type rule_val -type flow_key -type flow_val -type sbx_counters -type lpm4_key -type lpm6_key -type learned_val -type drop_val -type proc_info -type proc_key airlock airlock.c -- -I/usr/include/x86_64-linux-gnu
