"""Files: what one is from its bytes (`content`), and an image as a model is sent it (`images`). The
door that uploads and serves them is `chat.web.files`; a send's attachments are readied by
`chat.methods.send.attach`."""
