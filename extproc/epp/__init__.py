"""Envoy's side of the picker: the ext_proc stream and what is said to Envoy.

service.py   `ExtProcService`: one ext_proc stream per HTTP request (phases, body modes,
             lifecycle, exactly-once free)
answers.py   the endpoint-picker protocol: destination header and `envoy.lb` metadata, immediate
             responses, and the one error-to-HTTP table (`ANSWERS`)
"""
