from serve.cli import main

main()
