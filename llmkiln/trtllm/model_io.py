"""I/O and parameter keys of the tensorrtllm_backend model set, as data (transcribed, not templated).

Transcribed from the inflight_batcher_llm templates of the pinned generation, NVIDIA/TensorRT-LLM
triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt (the post-May-2025 home of the templates; read at
commits 2a9abd95 (ensemble, tensorrt_llm), 08dc37e3 (preprocessing), 89fd9b74 (postprocessing) and 0193dbd4
(tensorrt_llm_bls)), cross-checked against triton-inference-server/tensorrtllm_backend@c2e65b8. Differences
from c2e65b8: return_num_input_tokens / return_num_output_tokens inputs and num_input_tokens / num_output_tokens
outputs, `prompt_embedding_table_data_type`, the preprocessing IMAGES input and hf_model_path parameter, and
enable_trt_overlap commented out ("deprecated and doesn't have any effect"). The upstream ensemble lists the
output kv_cache_alloc_total_blocks twice; it is listed once here.

Each I/O row: (name, data type, dims, flags) where flags is a string of letters: o = optional, r = reshape to
[] (scalar), g = allow_ragged_batch. Data types written as placeholders upstream are resolved to the values the
backend README's quick start fills: logits_datatype TYPE_FP32, encoder_input_features_data_type TYPE_FP16,
prompt_embedding_table_data_type TYPE_FP16.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

T = mc.DataType
IO = tuple[str, int, tuple[int, ...], str]
LOGITS = T.TYPE_FP32

SCALAR_OPT = "or"  # optional, dims [1] reshaped to []


def _scalars(dtype: int, *names: str) -> list[IO]:
    return [(n, dtype, (1,), SCALAR_OPT) for n in names]


TENSORRT_LLM_INPUTS: list[IO] = [
    ("input_ids", T.TYPE_INT32, (-1,), "go"),
    ("encoder_input_features", T.TYPE_FP16, (-1, -1), "go"),
    ("encoder_output_lengths", T.TYPE_INT32, (1,), "ro"),
    ("input_lengths", T.TYPE_INT32, (1,), "r"),
    ("request_output_len", T.TYPE_INT32, (1,), "r"),
    ("num_return_sequences", T.TYPE_INT32, (1,), "ro"),
    ("draft_input_ids", T.TYPE_INT32, (-1,), "og"),
    ("decoder_input_ids", T.TYPE_INT32, (-1,), "og"),
    ("decoder_input_lengths", T.TYPE_INT32, (1,), "or"),
    ("draft_logits", LOGITS, (-1, -1), "og"),
    ("draft_acceptance_threshold", T.TYPE_FP32, (1,), "ro"),
    ("end_id", T.TYPE_INT32, (1,), "ro"),
    ("pad_id", T.TYPE_INT32, (1,), "ro"),
    ("stop_words_list", T.TYPE_INT32, (2, -1), "og"),
    ("bad_words_list", T.TYPE_INT32, (2, -1), "og"),
    ("embedding_bias", T.TYPE_FP32, (-1,), "og"),
    ("beam_width", T.TYPE_INT32, (1,), "ro"),
    ("temperature", T.TYPE_FP32, (1,), "ro"),
    ("runtime_top_k", T.TYPE_INT32, (1,), "ro"),
    ("runtime_top_p", T.TYPE_FP32, (1,), "ro"),
    ("runtime_top_p_min", T.TYPE_FP32, (1,), "ro"),
    ("runtime_top_p_decay", T.TYPE_FP32, (1,), "ro"),
    ("runtime_top_p_reset_ids", T.TYPE_INT32, (1,), "ro"),
    ("len_penalty", T.TYPE_FP32, (1,), "ro"),
    ("early_stopping", T.TYPE_BOOL, (1,), "ro"),
    ("repetition_penalty", T.TYPE_FP32, (1,), "ro"),
    ("min_tokens", T.TYPE_INT32, (1,), "ro"),
    ("beam_search_diversity_rate", T.TYPE_FP32, (1,), "ro"),
    ("presence_penalty", T.TYPE_FP32, (1,), "ro"),
    ("frequency_penalty", T.TYPE_FP32, (1,), "ro"),
    ("seed", T.TYPE_UINT64, (1,), "ro"),
    *_scalars(
        T.TYPE_BOOL,
        "return_log_probs",
        "return_context_logits",
        "return_generation_logits",
        "return_perf_metrics",
        "return_num_input_tokens",
        "return_num_output_tokens",
        "exclude_input_in_output",
        "stop",
        "streaming",
    ),
    ("prompt_embedding_table", T.TYPE_FP16, (-1, -1), "og"),
    ("prompt_table_extra_ids", T.TYPE_UINT64, (-1,), "og"),
    ("prompt_vocab_size", T.TYPE_INT32, (1,), "ro"),
    ("cross_attention_mask", T.TYPE_BOOL, (-1, -1), "og"),
    ("mrope_rotary_cos_sin", T.TYPE_FP32, (-1,), "o"),
    ("mrope_position_deltas", T.TYPE_INT64, (1,), "o"),
    ("lora_task_id", T.TYPE_UINT64, (1,), "ro"),
    ("lora_weights", T.TYPE_FP16, (-1, -1), "og"),
    ("lora_config", T.TYPE_INT32, (-1, 3), "og"),
    ("context_phase_params", T.TYPE_UINT8, (-1,), "og"),
    ("skip_cross_attn_blocks", T.TYPE_BOOL, (1,), "og"),
    ("retention_token_range_starts", T.TYPE_INT32, (-1,), "og"),
    ("retention_token_range_ends", T.TYPE_INT32, (-1,), "og"),
    ("retention_token_range_priorities", T.TYPE_INT32, (-1,), "og"),
    ("retention_token_range_durations_ms", T.TYPE_INT32, (-1,), "og"),
    ("retention_decode_priority", T.TYPE_INT32, (1,), "og"),
    ("retention_decode_duration_ms", T.TYPE_INT32, (1,), "og"),
    ("guided_decoding_guide_type", T.TYPE_STRING, (1,), "og"),
    ("guided_decoding_guide", T.TYPE_STRING, (1,), "og"),
    ("lookahead_window_size", T.TYPE_INT32, (1,), "og"),
    ("lookahead_ngram_size", T.TYPE_INT32, (1,), "og"),
    ("lookahead_verification_set_size", T.TYPE_INT32, (1,), "og"),
]

# Perf / accounting outputs shared by tensorrt_llm, tensorrt_llm_bls and the ensemble.
_PERF_OUTPUTS: list[IO] = [
    ("kv_cache_alloc_new_blocks", T.TYPE_INT32, (1,), ""),
    ("kv_cache_reused_blocks", T.TYPE_INT32, (1,), ""),
    ("kv_cache_alloc_total_blocks", T.TYPE_INT32, (1,), ""),
    ("arrival_time_ns", T.TYPE_INT64, (1,), ""),
    ("first_scheduled_time_ns", T.TYPE_INT64, (1,), ""),
    ("first_token_time_ns", T.TYPE_INT64, (1,), ""),
    ("last_token_time_ns", T.TYPE_INT64, (1,), ""),
    ("acceptance_rate", T.TYPE_FP32, (1,), ""),
    ("total_accepted_draft_tokens", T.TYPE_INT32, (1,), ""),
    ("total_draft_tokens", T.TYPE_INT32, (1,), ""),
    ("num_input_tokens", T.TYPE_INT32, (1,), ""),
    ("num_output_tokens", T.TYPE_INT32, (1,), ""),
]
_LOGPROB_OUTPUTS: list[IO] = [
    ("cum_log_probs", T.TYPE_FP32, (-1,), ""),
    ("output_log_probs", T.TYPE_FP32, (-1, -1), ""),
    ("context_logits", LOGITS, (-1, -1), ""),
    ("generation_logits", LOGITS, (-1, -1, -1), ""),
    ("batch_index", T.TYPE_INT32, (1,), ""),
    ("sequence_index", T.TYPE_INT32, (1,), ""),
]

TENSORRT_LLM_OUTPUTS: list[IO] = [
    ("output_ids", T.TYPE_INT32, (-1, -1), ""),
    ("sequence_length", T.TYPE_INT32, (-1,), ""),
    *_LOGPROB_OUTPUTS,
    ("context_phase_params", T.TYPE_UINT8, (-1,), ""),
    *_PERF_OUTPUTS,
]

PREPROCESSING_INPUTS: list[IO] = [
    ("QUERY", T.TYPE_STRING, (1,), ""),
    ("DECODER_QUERY", T.TYPE_STRING, (1,), "o"),
    ("IMAGE_BYTES", T.TYPE_UINT8, (-1, -1, -1, -1), "o"),
    ("IMAGE_URL", T.TYPE_STRING, (1,), "o"),
    ("IMAGES", T.TYPE_STRING, (-1,), "o"),
    ("VIDEO_BYTES", T.TYPE_UINT8, (-1, -1, -1, -1), "o"),
    ("REQUEST_OUTPUT_LEN", T.TYPE_INT32, (1,), ""),
    ("BAD_WORDS_DICT", T.TYPE_STRING, (-1,), "o"),
    ("STOP_WORDS_DICT", T.TYPE_STRING, (-1,), "o"),
    ("EMBEDDING_BIAS_WORDS", T.TYPE_STRING, (-1,), "o"),
    ("EMBEDDING_BIAS_WEIGHTS", T.TYPE_FP32, (-1,), "o"),
    ("END_ID", T.TYPE_INT32, (1,), "o"),
    ("PAD_ID", T.TYPE_INT32, (1,), "o"),
    ("PROMPT_TABLE_EXTRA_ID", T.TYPE_UINT64, (1,), "o"),
]
PREPROCESSING_OUTPUTS: list[IO] = [
    ("INPUT_ID", T.TYPE_INT32, (-1,), ""),
    ("REQUEST_INPUT_LEN", T.TYPE_INT32, (1,), ""),
    ("DECODER_INPUT_ID", T.TYPE_INT32, (-1,), ""),
    ("REQUEST_DECODER_INPUT_LEN", T.TYPE_INT32, (1,), ""),
    ("BAD_WORDS_IDS", T.TYPE_INT32, (2, -1), ""),
    ("STOP_WORDS_IDS", T.TYPE_INT32, (2, -1), ""),
    ("EMBEDDING_BIAS", T.TYPE_FP32, (-1,), ""),
    ("REQUEST_OUTPUT_LEN", T.TYPE_INT32, (-1,), ""),
    ("OUT_END_ID", T.TYPE_INT32, (1,), ""),
    ("OUT_PAD_ID", T.TYPE_INT32, (1,), ""),
    ("OUT_PROMPT_TABLE_EXTRA_IDS", T.TYPE_UINT64, (-1,), ""),
    ("PIXEL_VALUES", T.TYPE_FP16, (-1, -1, -1, -1), ""),
    ("ASPECT_RATIO_IDS", T.TYPE_INT64, (-1,), ""),
    ("ASPECT_RATIO_MASK", T.TYPE_INT64, (-1, -1), ""),
    ("CROSS_ATTENTION_MASK", T.TYPE_INT64, (-1, -1, -1), ""),
    ("IMAGE_SIZES", T.TYPE_INT64, (-1, 2), ""),
    ("IS_VIDEO_INPUT", T.TYPE_BOOL, (1,), ""),
    ("ATTENTION_MASK", T.TYPE_INT64, (-1,), ""),
    ("IMAGE_GRID_THW", T.TYPE_INT64, (3,), ""),
    ("VISION_INPUT_ID", T.TYPE_INT32, (-1,), ""),
]

POSTPROCESSING_INPUTS: list[IO] = [
    ("TOKENS_BATCH", T.TYPE_INT32, (-1, -1), ""),
    ("SEQUENCE_LENGTH", T.TYPE_INT32, (-1,), ""),
]
POSTPROCESSING_OUTPUTS: list[IO] = [("OUTPUT", T.TYPE_STRING, (-1,), "")]

# The client-facing inputs shared by the ensemble and tensorrt_llm_bls (same names, same types).
_SAMPLING_INPUTS: list[IO] = [
    ("end_id", T.TYPE_INT32, (1,), "o"),
    ("pad_id", T.TYPE_INT32, (1,), "o"),
    ("top_k", T.TYPE_INT32, (1,), "o"),
    ("top_p", T.TYPE_FP32, (1,), "o"),
    ("temperature", T.TYPE_FP32, (1,), "o"),
    ("length_penalty", T.TYPE_FP32, (1,), "o"),
    ("repetition_penalty", T.TYPE_FP32, (1,), "o"),
    ("min_tokens", T.TYPE_INT32, (1,), "o"),
    ("presence_penalty", T.TYPE_FP32, (1,), "o"),
    ("frequency_penalty", T.TYPE_FP32, (1,), "o"),
    ("seed", T.TYPE_UINT64, (1,), "o"),
]

ENSEMBLE_INPUTS: list[IO] = [
    ("text_input", T.TYPE_STRING, (1,), ""),
    ("decoder_text_input", T.TYPE_STRING, (1,), "o"),
    ("max_tokens", T.TYPE_INT32, (1,), ""),
    ("num_return_sequences", T.TYPE_INT32, (1,), "o"),
    ("bad_words", T.TYPE_STRING, (-1,), "o"),
    ("stop_words", T.TYPE_STRING, (-1,), "o"),
    ("exclude_input_in_output", T.TYPE_BOOL, (1,), "o"),
    *_SAMPLING_INPUTS,
    ("return_log_probs", T.TYPE_BOOL, (1,), "o"),
    ("return_context_logits", T.TYPE_BOOL, (1,), "o"),
    ("return_generation_logits", T.TYPE_BOOL, (1,), "o"),
    ("return_perf_metrics", T.TYPE_BOOL, (1,), "o"),
    ("return_num_input_tokens", T.TYPE_BOOL, (1,), "o"),
    ("return_num_output_tokens", T.TYPE_BOOL, (1,), "o"),
    ("beam_width", T.TYPE_INT32, (1,), "o"),
    ("stream", T.TYPE_BOOL, (1,), "o"),
    ("prompt_embedding_table", T.TYPE_FP16, (-1, -1), "o"),
    ("prompt_table_extra_id", T.TYPE_UINT64, (1,), "o"),
    ("prompt_vocab_size", T.TYPE_INT32, (1,), "o"),
    ("embedding_bias_words", T.TYPE_STRING, (-1,), "o"),
    ("embedding_bias_weights", T.TYPE_FP32, (-1,), "o"),
    ("lora_task_id", T.TYPE_UINT64, (1,), "o"),
    ("lora_weights", T.TYPE_FP16, (-1, -1), "og"),
    ("lora_config", T.TYPE_INT32, (-1, 3), "og"),
    ("guided_decoding_guide_type", T.TYPE_STRING, (1,), "og"),
    ("guided_decoding_guide", T.TYPE_STRING, (1,), "og"),
]
ENSEMBLE_OUTPUTS: list[IO] = [("text_output", T.TYPE_STRING, (-1,), ""), *_LOGPROB_OUTPUTS, *_PERF_OUTPUTS]

BLS_INPUTS: list[IO] = [
    ("text_input", T.TYPE_STRING, (1,), ""),
    ("decoder_text_input", T.TYPE_STRING, (1,), "o"),
    ("image_input", T.TYPE_FP16, (-1, 3, -1, -1), "o"),
    ("image_bytes_input", T.TYPE_UINT8, (-1, -1, -1, -1), "o"),
    ("image_url_input", T.TYPE_STRING, (1,), "o"),
    ("video_bytes_input", T.TYPE_UINT8, (-1, -1, -1, -1), "o"),
    ("max_tokens", T.TYPE_INT32, (1,), ""),
    ("bad_words", T.TYPE_STRING, (-1,), "o"),
    ("stop_words", T.TYPE_STRING, (-1,), "o"),
    ("exclude_input_in_output", T.TYPE_BOOL, (1,), "o"),
    *_SAMPLING_INPUTS,
    ("return_log_probs", T.TYPE_BOOL, (1,), "ro"),
    ("return_context_logits", T.TYPE_BOOL, (1,), "ro"),
    ("return_generation_logits", T.TYPE_BOOL, (1,), "ro"),
    ("num_return_sequences", T.TYPE_INT32, (1,), "ro"),
    ("beam_width", T.TYPE_INT32, (1,), "o"),
    ("stream", T.TYPE_BOOL, (1,), "o"),
    ("prompt_embedding_table", T.TYPE_FP16, (-1, -1), "o"),
    ("prompt_vocab_size", T.TYPE_INT32, (1,), "o"),
    ("prompt_table_extra_id", T.TYPE_UINT64, (1,), "o"),
    ("embedding_bias_words", T.TYPE_STRING, (-1,), "o"),
    ("embedding_bias_weights", T.TYPE_FP32, (-1,), "o"),
    ("num_draft_tokens", T.TYPE_INT32, (1,), "o"),
    ("use_draft_logits", T.TYPE_BOOL, (1,), "ro"),
    ("lora_task_id", T.TYPE_UINT64, (1,), "ro"),
    ("lora_weights", T.TYPE_FP16, (-1, -1), "og"),
    ("lora_config", T.TYPE_INT32, (-1, 3), "og"),
    ("return_perf_metrics", T.TYPE_BOOL, (1,), "ro"),
    ("return_num_input_tokens", T.TYPE_BOOL, (1,), "ro"),
    ("return_num_output_tokens", T.TYPE_BOOL, (1,), "ro"),
    ("guided_decoding_guide_type", T.TYPE_STRING, (1,), "o"),
    ("guided_decoding_guide", T.TYPE_STRING, (1,), "o"),
]
BLS_OUTPUTS: list[IO] = ENSEMBLE_OUTPUTS

# Ensemble wiring: (model, {model input: ensemble tensor}, {model output: ensemble tensor}).
ENSEMBLE_STEPS: list[tuple[str, dict[str, str], dict[str, str]]] = [
    (
        "preprocessing",
        {
            "QUERY": "text_input",
            "DECODER_QUERY": "decoder_text_input",
            "REQUEST_OUTPUT_LEN": "max_tokens",
            "BAD_WORDS_DICT": "bad_words",
            "STOP_WORDS_DICT": "stop_words",
            "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
            "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
            "END_ID": "end_id",
            "PAD_ID": "pad_id",
            "PROMPT_TABLE_EXTRA_ID": "prompt_table_extra_id",
        },
        {
            "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
            "INPUT_ID": "_INPUT_ID",
            "REQUEST_DECODER_INPUT_LEN": "_REQUEST_DECODER_INPUT_LEN",
            "DECODER_INPUT_ID": "_DECODER_INPUT_ID",
            "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
            "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
            "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
            "EMBEDDING_BIAS": "_EMBEDDING_BIAS",
            "OUT_END_ID": "_PREPROCESSOR_END_ID",
            "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
            "OUT_PROMPT_TABLE_EXTRA_IDS": "_OUT_PROMPT_TABLE_EXTRA_IDS",
        },
    ),
    (
        "tensorrt_llm",
        {
            "input_ids": "_INPUT_ID",
            "decoder_input_ids": "_DECODER_INPUT_ID",
            "input_lengths": "_REQUEST_INPUT_LEN",
            "decoder_input_lengths": "_REQUEST_DECODER_INPUT_LEN",
            "exclude_input_in_output": "exclude_input_in_output",
            "request_output_len": "_REQUEST_OUTPUT_LEN",
            "end_id": "_PREPROCESSOR_END_ID",
            "pad_id": "_PREPROCESSOR_PAD_ID",
            "embedding_bias": "_EMBEDDING_BIAS",
            "runtime_top_k": "top_k",
            "runtime_top_p": "top_p",
            "temperature": "temperature",
            "len_penalty": "length_penalty",
            "repetition_penalty": "repetition_penalty",
            "min_tokens": "min_tokens",
            "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty",
            "seed": "seed",
            "return_log_probs": "return_log_probs",
            "return_context_logits": "return_context_logits",
            "return_generation_logits": "return_generation_logits",
            "return_perf_metrics": "return_perf_metrics",
            "return_num_input_tokens": "return_num_input_tokens",
            "return_num_output_tokens": "return_num_output_tokens",
            "num_return_sequences": "num_return_sequences",
            "beam_width": "beam_width",
            "streaming": "stream",
            "prompt_embedding_table": "prompt_embedding_table",
            "prompt_vocab_size": "prompt_vocab_size",
            "stop_words_list": "_STOP_WORDS_IDS",
            "bad_words_list": "_BAD_WORDS_IDS",
            "prompt_table_extra_ids": "_OUT_PROMPT_TABLE_EXTRA_IDS",
            "lora_task_id": "lora_task_id",
            "lora_weights": "lora_weights",
            "lora_config": "lora_config",
            "guided_decoding_guide_type": "guided_decoding_guide_type",
            "guided_decoding_guide": "guided_decoding_guide",
        },
        {
            "output_ids": "_TOKENS_BATCH",
            "sequence_length": "_SEQUENCE_LENGTH",
            **{name: name for name, *_ in _LOGPROB_OUTPUTS},
            **{name: name for name, *_ in _PERF_OUTPUTS},
        },
    ),
    (
        "postprocessing",
        {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
        {"OUTPUT": "text_output"},
    ),
]

# Every `parameters` key of the upstream templates (the pinned generation). The repository writer must account for
# each one: filled with a concrete value, or left out with the reason recorded in OMITTED_PARAMETERS.
UPSTREAM_PARAMETERS: dict[str, tuple[str, ...]] = {
    "tensorrt_llm": (
        "max_beam_width", "FORCE_CPU_ONLY_INPUT_TENSORS", "gpt_model_type", "gpt_model_path", "encoder_model_path",
        "max_tokens_in_paged_kv_cache", "max_attention_window_size", "sink_token_length", "batch_scheduler_policy",
        "kv_cache_free_gpu_mem_fraction", "cross_kv_cache_fraction", "kv_cache_host_memory_bytes",
        "kv_cache_onboard_blocks", "exclude_input_in_output", "cancellation_check_period_ms", "stats_check_period_ms",
        "iter_stats_max_iterations", "request_stats_max_iterations", "enable_kv_cache_reuse", "normalize_log_probs",
        "enable_chunked_context", "gpu_device_ids", "participant_ids", "num_nodes",
        "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size", "lora_cache_gpu_memory_fraction",
        "lora_cache_host_memory_bytes", "lora_prefetch_dir", "decoding_mode", "executor_worker_path",
        "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size", "medusa_choices",
        "eagle_choices", "gpu_weights_percent", "enable_context_fmha_fp32_acc", "multi_block_mode",
        "cuda_graph_mode", "cuda_graph_cache_size", "speculative_decoding_fast_logits", "tokenizer_dir",
        "guided_decoding_backend", "xgrammar_tokenizer_info_path",
    ),
    "preprocessing": (
        "tokenizer_dir", "add_special_tokens", "multimodal_model_path", "gpt_model_path", "max_num_images",
        "hf_model_path",
    ),
    "postprocessing": ("tokenizer_dir", "skip_special_tokens"),
    "tensorrt_llm_bls": (
        "accumulate_tokens", "tensorrt_llm_model_name", "tensorrt_llm_draft_model_name", "multimodal_encoders_name",
    ),
    "ensemble": (),
}  # fmt: skip

# Parameters deliberately left out: absent, the backend uses its documented default; an empty or placeholder
# value would be parsed (C++ model_instance_state.cc at tensorrtllm_backend@c2e65b8) and could switch a feature on.
OMITTED_PARAMETERS: dict[str, dict[str, str]] = {
    "tensorrt_llm": {
        "encoder_model_path": "decoder-only Llama; an empty path makes the backend log a failed existence check",
        "cross_kv_cache_fraction": "encoder-decoder models only; TensorRT-LLM rejects it for decoder-only models",
        "gpu_device_ids": "orchestrator / multi-instance mode only; absent = all visible GPUs",
        "participant_ids": "orchestrator / multi-instance mode only",
        "num_nodes": "multi-node orchestrator mode only",
        "lora_prefetch_dir": "no LoRA adapters; an empty string would still be handed to the PEFT cache",
        "medusa_choices": "speculative decoding (Medusa) is off",
        "eagle_choices": "speculative decoding (EAGLE) is off",
        "lookahead_window_size": "lookahead decoding is off",
        "lookahead_ngram_size": "lookahead decoding is off",
        "lookahead_verification_set_size": "lookahead decoding is off",
    },
    "preprocessing": {
        "max_num_images": "multimodal models only (absent = None)",
        "hf_model_path": "read only for multimodal processors (mllama, llava_onevision, qwen2_vl, pixtral)",
    },
}
