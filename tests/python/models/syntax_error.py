def mixer(vocab_size, hidden_size, sequence_length)
    return None
