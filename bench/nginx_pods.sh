# Sourced by bench/router_metering.sh and bench/router_instructions.sh: nginx as two kinds of
# pods answering vLLM-shaped bodies (a JSON completion with usage; a 16-token stream ending in
# vLLM's usage chunk), so both benches measure the router against the same answers.
# start_nginx_pods WORK CONNECTIONS JSON_PORT_A JSON_PORT_B STREAM_PORT_A STREAM_PORT_B
start_nginx_pods() {
  local work=$1 connections=$2
  local head='{"id":"cmpl-1","object":"text_completion","created":1,"model":"m"'
  local json_body="$head"',"choices":[{"index":0,"text":"hello world","finish_reason":"length"}],"usage":{"prompt_tokens":50,"completion_tokens":50,"total_tokens":100}}'
  local sse="" finish i
  for i in $(seq 1 16); do
    finish=null; [[ $i == 16 ]] && finish='"length"'
    sse+="data: $head"',"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":'"$finish"',"stop_reason":null}]}'$'\n\n'
  done
  sse+="data: $head"',"choices":[],"usage":{"prompt_tokens":50,"total_tokens":66,"completion_tokens":16}}'$'\n\n'
  sse+=$'data: [DONE]\n\n'
  cat >"$work/nginx.conf" <<NGX
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx.err;
events { worker_connections $connections; }
http { access_log off;
  server { listen 127.0.0.1:$3; listen 127.0.0.1:$4;
    location / { default_type application/json; return 200 '$json_body'; } }
  server { listen 127.0.0.1:$5; listen 127.0.0.1:$6;
    location / { default_type text/event-stream; return 200 '$sse'; } } }
NGX
  nginx -c "$work/nginx.conf"
}
